"""Generation engines: the `GenerationEngine` protocol, `HFEngine` (transformers); `VLLMEngine` is in `vllm_engine.py`.

An engine turns already-templated prompt texts into sampled completions and serves one set of weights, tagged
with the learner version that produced them. The contract every engine keeps (seeds, completion order, stops,
sampling log-probs that equal the learner's policy log-probs at T = 1 and p = 1, the checksum) is
`GenerationEngine`'s docstring. Tests: tests/actors/test_engines.py.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeAlias, runtime_checkable

import numpy as np
import torch

from exgrpo.core.config import Dtype
from exgrpo.transport.checksums import grouped_sums

WeightValue: TypeAlias = torch.Tensor | np.ndarray


@dataclass(frozen=True)
class Completion:
    """One sampled completion: its tokens, their sampling log-probs, decoded text, why it stopped."""

    token_ids: tuple[int, ...]  # response tokens only; ends with eos when finish_reason == "stop"
    logprobs: tuple[float, ...]  # log-prob of each sampled token under the sampling distribution
    text: str  # decoded response, special tokens skipped
    finish_reason: str  # "stop" (eos) or "length" (max_tokens reached)
    # ((first token, policy version), ...) when the weights changed while it was sampled (the continuous
    # sampler); empty when one version sampled it all
    version_spans: tuple[tuple[int, int], ...] = ()


@runtime_checkable
class GenerationEngine(Protocol):
    """What a sampler needs from an engine, and the contract every engine keeps.

    `generate(prompts, n=..., max_tokens=..., temperature=T, top_p=p, seed=...)`:

    - `seed`: None (unseeded), one int for the call, or one int per prompt (the sampler's per-request seeds,
      `actors.sampler_common.request_seed`); the same seeds, prompts and counts give the same completions;
    - per prompt, its n completions (n an int, or one count per prompt), in prompt order;
    - prompt ids are `tokenize(text)`: the text's tokens with no special tokens added (a template that needs
      BOS writes it into the text);
    - a completion stops after the first eos token, which is part of it (with its log-prob), or after
      `max_tokens` tokens; `finish_reason` is "stop" or "length";
    - `logprobs[t]` = log pi_T,p(y_t | prompt, y_<t): the log-prob of the sampled token under the distribution
      it was sampled from, softmax(logits / T) restricted to the top-p nucleus and renormalised. At T = 1 and
      p = 1 these are the policy log-probs log softmax(logits) the learner computes (up to float error), which
      is what the importance ratios need. T = 0 is greedy decoding; its log-probs are those of softmax(logits).

    `checksum()` is the float64 sum of all distinct parameters of the HF-named model being served (a tied
    lm_head counts once), to compare with the learner's `module_checksum(model)` or with
    `weights_checksum(state_dict, ...)` of the weights it sent.
    """

    @property
    def version(self) -> int:
        """Learner version of the weights being served (0 = the weights loaded from disk)."""
        ...

    def generate(
        self,
        prompts: Sequence[str],
        *,
        n: int | Sequence[int],
        max_tokens: int,
        temperature: float = 1.0,
        top_p: float = 1.0,
        seed: int | Sequence[int] | None = None,
    ) -> list[list[Completion]]: ...

    def tokenize(self, text: str) -> tuple[int, ...]: ...

    def detokenize(self, token_ids: Sequence[int]) -> str: ...

    def load_weights(self, weights: Mapping[str, WeightValue], *, version: int) -> None: ...

    def checksum(self) -> float: ...


class TokenizingEngine(GenerationEngine, Protocol):
    """A `GenerationEngine` that also holds its model's HF tokenizer (both of ours: `make_engine`'s); a sampler
    renders chat templates with it."""

    tokenizer: Any


# --------------------------------------------------------------------------- shared helpers


def to_tensor(value: WeightValue) -> torch.Tensor:
    """A torch view of a weight; read-only numpy arrays (zero-copy from the Ray object store) are
    wrapped without a copy (the engines only read them)."""
    if isinstance(value, torch.Tensor):
        return value
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return torch.from_numpy(np.asarray(value))


def weights_checksum(weights: Mapping[str, WeightValue], *, tie_word_embeddings: bool) -> float:
    """Float64 sum of an HF-named state dict, counting a tied `lm_head.weight` once (it is the
    embedding), so that it equals `module_checksum` of a model holding these weights."""
    total = 0.0
    for name, value in weights.items():
        if tie_word_embeddings and name == "lm_head.weight":
            continue
        total += float(to_tensor(value).double().sum())
    return total


def module_checksum(module: torch.nn.Module) -> float:
    """Float64 sum of a module's distinct parameters (tied parameters are yielded once)."""
    with torch.no_grad():
        return float(sum(p.detach().double().sum() for p in module.parameters()))


def normalize_counts(prompts: Sequence[str], n: int | Sequence[int]) -> list[int]:
    """One completion count per prompt, validated."""
    counts = [n] * len(prompts) if isinstance(n, int) else [int(k) for k in n]
    if len(counts) != len(prompts):
        raise ValueError(f"n has {len(counts)} counts for {len(prompts)} prompts; give one count per prompt")
    if any(k < 0 for k in counts):
        raise ValueError(f"completion counts must be >= 0, got {counts}")
    return counts


def call_seed(prompts: Sequence[str], seed: int | Sequence[int] | None) -> int | None:
    """One seed for a whole call: the int itself, or the first prompt's of a per-prompt list."""
    if seed is None or isinstance(seed, int):
        return seed
    seeds = [int(s) for s in seed]
    if len(seeds) != len(prompts):
        raise ValueError(f"seed has {len(seeds)} values for {len(prompts)} prompts; give one per prompt")
    return seeds[0] if seeds else None


def check_sampling(*, max_tokens: int, temperature: float, top_p: float) -> None:
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0 (0 = greedy), got {temperature}")
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")


# --------------------------------------------------------------------------- transformers engine


class TokenizedEngine:
    """What both engines share: the weight version tag and tokenization without special tokens."""

    tokenizer: Any
    _version: int = 0

    @property
    def version(self) -> int:
        return self._version

    def tokenize(self, text: str) -> tuple[int, ...]:
        return tuple(self.tokenizer.encode(text, add_special_tokens=False))

    def detokenize(self, token_ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(token_ids), skip_special_tokens=True)


class HFEngine(TokenizedEngine):
    """transformers `generate` on one process (CPU runs and small models).

    Prompts are left-padded into one batch per call (rows = prompts repeated n times, in chunks of
    `max_batch_rows`). Log-probs come from the processed scores `generate` returns (logits after
    temperature and top-p warping): log_softmax(score)[token]. The model's own generation defaults
    (top_k, repetition penalty, ...) are replaced by a clean config, so at T = 1, top_p = 1 the
    processed scores are the raw logits.
    """

    def __init__(
        self, model_path: str | Path, *, dtype: Dtype = "float32", seed: int = 0, max_batch_rows: int = 256
    ) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

        torch.set_num_threads(1)
        torch.manual_seed(seed)
        self.tokenizer = AutoTokenizer.from_pretrained(str(model_path))
        self.model = AutoModelForCausalLM.from_pretrained(str(model_path), dtype=getattr(torch, dtype)).eval()
        eos = self.model.generation_config.eos_token_id
        eos_ids = {*([] if eos is None else [eos] if isinstance(eos, int) else eos)}
        if self.tokenizer.eos_token_id is not None:
            eos_ids.add(self.tokenizer.eos_token_id)
        if not eos_ids:
            raise ValueError(f"{model_path}: neither the tokenizer nor generation_config names an eos token")
        self.eos_ids = frozenset(eos_ids)
        pad = self.tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else min(self.eos_ids)
        self.model.generation_config = GenerationConfig(
            eos_token_id=sorted(self.eos_ids), pad_token_id=self.pad_id, bos_token_id=None
        )
        self.max_batch_rows = max_batch_rows
        self._version = 0

    def generate(
        self,
        prompts: Sequence[str],
        *,
        n: int | Sequence[int],
        max_tokens: int,
        temperature: float = 1.0,
        top_p: float = 1.0,
        seed: int | Sequence[int] | None = None,
    ) -> list[list[Completion]]:
        """All rows of a call are drawn from one generator seeded with `call_seed` (an int, or the first
        prompt's seed of a per-prompt list), so a call is reproducible given its seed, prompts and counts."""
        check_sampling(max_tokens=max_tokens, temperature=temperature, top_p=top_p)
        counts = normalize_counts(prompts, n)
        seed = call_seed(prompts, seed)
        rows = [self.tokenize(p) for p, k in zip(prompts, counts, strict=True) for _ in range(k)]
        if any(not r for r in rows):
            raise ValueError("empty prompt: every prompt must have at least one token")
        flat: list[Completion] = []
        with torch.random.fork_rng(devices=[], enabled=seed is not None):
            if seed is not None:
                torch.manual_seed(seed)
            for start in range(0, len(rows), self.max_batch_rows):
                flat.extend(
                    self._generate_rows(
                        rows[start : start + self.max_batch_rows],
                        max_tokens=max_tokens,
                        temperature=temperature,
                        top_p=top_p,
                    )
                )
        out, i = [], 0
        for k in counts:
            out.append(flat[i : i + k])
            i += k
        return out

    @torch.no_grad()
    def _generate_rows(
        self, rows: list[tuple[int, ...]], *, max_tokens: int, temperature: float, top_p: float
    ) -> list[Completion]:
        width = max(len(r) for r in rows)
        input_ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)  # (R, P), left-padded
        attention = torch.zeros((len(rows), width), dtype=torch.long)
        for i, r in enumerate(rows):
            input_ids[i, width - len(r) :] = torch.tensor(r)
            attention[i, width - len(r) :] = 1
        greedy = temperature == 0
        out = self.model.generate(
            input_ids=input_ids,
            attention_mask=attention,
            do_sample=not greedy,
            temperature=None if greedy else temperature,
            top_p=None if greedy else top_p,
            top_k=None if greedy else 0,  # 0: no top-k cut when sampling; greedy takes none (else a warning)
            max_new_tokens=max_tokens,
            num_return_sequences=1,
            output_scores=True,
            return_dict_in_generate=True,
        )
        tokens = out.sequences[:, width:]  # (R, S), S <= max_tokens
        logprobs = torch.stack(
            [
                torch.log_softmax(s.float(), dim=-1).gather(1, tokens[:, t : t + 1]).squeeze(1)
                for t, s in enumerate(out.scores)
            ],
            dim=1,
        )  # (R, S)
        completions = []
        for ids, lps in zip(tokens.tolist(), logprobs.tolist(), strict=True):
            end = next((t + 1 for t, tok in enumerate(ids) if tok in self.eos_ids), None)
            ids, lps = (ids, lps) if end is None else (ids[:end], lps[:end])
            completions.append(
                Completion(
                    token_ids=tuple(ids),
                    logprobs=tuple(lps),
                    text=self.detokenize(ids),
                    finish_reason="length" if end is None else "stop",
                )
            )
        return completions

    def load_weights(self, weights: Mapping[str, WeightValue], *, version: int) -> None:
        """Copy a full HF-named state dict into the model (strict: every name must match, shapes too).

        One `copy_` per distinct tensor (a tied head is the embedding: copied once), without
        `load_state_dict`'s per-module machinery: the load is the copy out of the shared object."""
        targets = self.model.state_dict(keep_vars=True)
        if missing := sorted(set(targets) - set(weights)):
            raise RuntimeError(f"load_weights: Missing key(s) in state_dict: {missing}")
        if unexpected := sorted(set(weights) - set(targets)):
            raise RuntimeError(f"load_weights: Unexpected key(s) in state_dict: {unexpected}")
        done: set[int] = set()
        with torch.no_grad():
            for name, value in weights.items():
                target, source = targets[name], to_tensor(value)
                if target.shape != source.shape:
                    raise RuntimeError(
                        f"load_weights: {name} has shape {tuple(source.shape)}, the model "
                        f"{tuple(target.shape)}"
                    )
                if target.data_ptr() not in done:
                    target.copy_(source)
                    done.add(target.data_ptr())
        self._version = version

    def checksum(self) -> float:
        return module_checksum(self.model)

    def layer_sums(self) -> tuple[tuple[str, float], ...]:
        """(group, float64 sum) of the served parameters per ``exgrpo.transport.checksums.layer_of`` group."""
        return tuple((g, total) for g, total, _ in grouped_sums(self.model.named_parameters()))


# --------------------------------------------------------------------------- factory
