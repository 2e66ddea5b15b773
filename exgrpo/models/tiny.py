"""Locally made tiny models and their character-level tokenizer (no Ray, vLLM or DeepSpeed).

- `build_char_tokenizer()`: one token per printable ASCII character and "\\n", plus `<|pad|>` (0) and
  `<|endoftext|>` (1, eos), stored as a byte-level BPE without merges, so transformers and vLLM (which builds
  `Qwen2Tokenizer` for a qwen2 directory) give the same ids and spaces and newlines round-trip.
- `build_tiny_model(out_dir, spec=...)`: a random causal LM (qwen2 by default) whose weights are filled by a
  fixed-seed generator in name order, so they do not depend on the transformers version.
Tests: tests/exgrpo/models/test_models.py.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedTokenizerFast

PAD_TOKEN = "<|pad|>"
EOS_TOKEN = "<|endoftext|>"
ALPHABET = "\n" + "".join(chr(c) for c in range(32, 127))  # the 96 characters the tokenizer knows
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)
_BUILD_FORMAT = 1  # bump when the builders change, so cached builtin models are rebuilt


def _byte_symbols() -> dict[int, str]:
    """GPT-2's byte -> printable unicode map used by byte-level BPE (e.g. space -> "Ġ", "\\n" -> "Ċ")."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    symbols, extra = {}, 0
    for b in range(256):
        if b in printable:
            symbols[b] = chr(b)
        else:
            symbols[b] = chr(256 + extra)
            extra += 1
    return symbols


def build_char_tokenizer() -> PreTrainedTokenizerFast:
    """Character-level tokenizer: ids 0 = pad, 1 = eos, then one id per character of `ALPHABET`."""
    symbols = _byte_symbols()
    vocab = {PAD_TOKEN: 0, EOS_TOKEN: 1}
    for ch in ALPHABET:
        vocab[symbols[ord(ch)]] = len(vocab)
    core = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token=PAD_TOKEN,
        eos_token=EOS_TOKEN,
        clean_up_tokenization_spaces=False,
        chat_template=CHAT_TEMPLATE,
    )


def save_tokenizer(tokenizer: PreTrainedTokenizerFast, out_dir: Path) -> None:
    """Save so that `AutoTokenizer.from_pretrained(out_dir)` builds a generic fast tokenizer where the
    model type allows it (`tokenizer_class` = PreTrainedTokenizerFast in tokenizer_config.json)."""
    tokenizer.save_pretrained(out_dir)
    config_path = Path(out_dir) / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config["clean_up_tokenization_spaces"] = False
    config_path.write_text(json.dumps(config, indent=2) + "\n")


@dataclass(frozen=True)
class TinyModelSpec:
    """Shape of a tiny random causal LM. vLLM's CPU attention needs head_dim in {32, 64, 80, 96, ...}."""

    arch: Literal["qwen2", "llama"] = "qwen2"  # HF model_type
    hidden_size: int = 64  # model width
    num_layers: int = 2  # decoder blocks
    num_heads: int = 2  # attention heads
    num_kv_heads: int = 1  # key/value heads (grouped-query attention when < num_heads)
    head_dim: int = 32  # per-head width (not tied to hidden_size / num_heads)
    intermediate_size: int = 128  # MLP width
    max_position: int = 256  # longest sequence (prompt + response)
    tie_word_embeddings: bool = True  # lm_head shares the input embedding
    init_std: float = 0.02  # std of the normal init of matrices (0.02: near-uniform next-token law)
    seed: int = 0  # seed of the weight generator

    def fingerprint(self) -> str:
        """Short hash of the spec, the tokenizer alphabet and the builder format (the cache key)."""
        payload = json.dumps(
            {"spec": dataclasses.asdict(self), "alphabet": ALPHABET, "format": _BUILD_FORMAT}, sort_keys=True
        )
        return hashlib.sha256(payload.encode()).hexdigest()[:12]


def build_tiny_model(out_dir: Path, *, spec: TinyModelSpec) -> Path:
    """Write a tiny random model (float32 safetensors), its config and the char tokenizer to `out_dir`.

    Weights are deterministic in `spec`: norm weights are 1, biases 0, every other parameter is
    drawn from N(0, init_std^2) by one generator seeded with `spec.seed`, in sorted name order.
    """
    out_dir = Path(out_dir)
    tokenizer = build_char_tokenizer()
    config = AutoConfig.for_model(
        spec.arch,
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        head_dim=spec.head_dim,
        intermediate_size=spec.intermediate_size,
        max_position_embeddings=spec.max_position,
        tie_word_embeddings=spec.tie_word_embeddings,
        initializer_range=spec.init_std,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
        dtype="float32",
    )
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    generator = torch.Generator().manual_seed(spec.seed)
    with torch.no_grad():
        for name, param in sorted(model.named_parameters()):
            if name.endswith("norm.weight"):
                param.fill_(1.0)
            elif name.endswith(".bias"):
                param.zero_()
            else:
                param.copy_(torch.randn(param.shape, generator=generator) * spec.init_std)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.bos_token_id = None
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    save_tokenizer(tokenizer, out_dir)
    return out_dir
