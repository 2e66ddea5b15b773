"""Tiny local models: the char tokenizer's ids and round trip, deterministic weights, the builtin cache."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoConfig, AutoTokenizer

import exgrpo.models.resolve as models
from exgrpo.models.resolve import BuiltinModel, ModelResolveError, register_builtin, resolve_model
from exgrpo.models.tiny import ALPHABET, TinyModelSpec, build_char_tokenizer, build_tiny_model

torch.set_num_threads(1)

TEXT = "  two spaces\nnew line\n\n 1 + 2 = 3 \\boxed{3}~"


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return resolve_model("builtin:tiny", cache_dir=str(tmp_path_factory.mktemp("cache")))


def test_char_tokenizer_ids_by_hand() -> None:
    tok = build_char_tokenizer()
    # ids: 0 pad, 1 eos, then ALPHABET = "\n" + chr(32..126): "\n" -> 2, chr(c) -> 3 + (c - 32)
    assert len(tok) == 2 + 96 == len(ALPHABET) + 2
    assert (tok.pad_token_id, tok.eos_token_id) == (0, 1)
    # " " -> 3, "A" (65) -> 36, "a" (97) -> 68, "~" (126) -> 97
    assert tok.encode("\n A a~", add_special_tokens=False) == [2, 3, 36, 3, 68, 97]
    assert tok.encode("a<|endoftext|>", add_special_tokens=False) == [68, 1]


def test_saved_tokenizer_round_trips_spaces_and_newlines(tiny_dir: Path) -> None:
    tok = AutoTokenizer.from_pretrained(tiny_dir)  # a qwen2 dir: transformers builds Qwen2Tokenizer
    ids = tok.encode(TEXT, add_special_tokens=False)
    assert len(ids) == len(TEXT)  # one token per character
    assert tok.decode(ids) == TEXT
    assert ids == build_char_tokenizer().encode(TEXT, add_special_tokens=False)
    assert tok.decode([*ids, 1, 0], skip_special_tokens=True) == TEXT
    assert (tok.pad_token_id, tok.eos_token_id) == (0, 1)


def test_llama_dir_loads_the_generic_fast_tokenizer_with_the_same_ids(tmp_path: Path) -> None:
    out = build_tiny_model(tmp_path / "llama", spec=TinyModelSpec(arch="llama"))
    tok = AutoTokenizer.from_pretrained(out)
    assert type(tok).__name__ in ("TokenizersBackend", "PreTrainedTokenizerFast")
    ids = tok.encode(TEXT, add_special_tokens=False)
    assert ids == build_char_tokenizer().encode(TEXT, add_special_tokens=False)
    assert tok.decode(ids) == TEXT


def test_chat_template_renders(tiny_dir: Path) -> None:
    tok = AutoTokenizer.from_pretrained(tiny_dir)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "1+1?"}]
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == "system: Be brief.\nuser: 1+1?\nassistant: "


def test_tiny_model_config_and_weights(tiny_dir: Path) -> None:
    config = AutoConfig.from_pretrained(tiny_dir)
    spec = TinyModelSpec()
    assert config.model_type == "qwen2"
    assert (config.vocab_size, config.hidden_size, config.head_dim) == (98, spec.hidden_size, 32)
    assert config.tie_word_embeddings and config.eos_token_id == 1
    weights = load_file(tiny_dir / "model.safetensors")
    assert all(w.dtype == torch.float32 for w in weights.values())
    assert "lm_head.weight" not in weights  # tied: stored once, as the embedding
    norm = weights["model.norm.weight"]
    assert torch.equal(norm, torch.ones_like(norm))
    assert torch.equal(weights["model.layers.0.self_attn.q_proj.bias"], torch.zeros(64))
    emb = weights["model.embed_tokens.weight"]  # 98 x 64 draws of N(0, 0.02^2): sample std within 5%
    assert emb.shape == (98, 64) and abs(float(emb.std()) - 0.02) < 0.001


def test_build_is_deterministic_in_the_spec(tmp_path: Path) -> None:
    spec = TinyModelSpec(num_layers=1)
    a = load_file(build_tiny_model(tmp_path / "a", spec=spec) / "model.safetensors")
    b = load_file(build_tiny_model(tmp_path / "b", spec=spec) / "model.safetensors")
    c = load_file(
        build_tiny_model(tmp_path / "c", spec=TinyModelSpec(num_layers=1, seed=1)) / "model.safetensors"
    )
    assert a.keys() == b.keys() == c.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["model.embed_tokens.weight"], c["model.embed_tokens.weight"])
    assert spec.fingerprint() == TinyModelSpec(num_layers=1).fingerprint() != TinyModelSpec().fingerprint()


def test_resolve_builds_once_and_reuses(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = resolve_model("builtin:tiny", cache_dir=str(tmp_path))
    assert first == tmp_path / "models" / f"tiny-{TinyModelSpec().fingerprint()}"
    stamp = (first / "model.safetensors").stat().st_mtime_ns

    def no_rebuild(*args: object, **kwargs: object) -> Path:
        raise AssertionError("the cached model was rebuilt")

    monkeypatch.setattr(models, "build_tiny_model", no_rebuild)
    assert resolve_model("builtin:tiny", cache_dir=str(tmp_path)) == first
    assert (first / "model.safetensors").stat().st_mtime_ns == stamp
    assert os.listdir(tmp_path / "models") == [first.name]  # no temporary build left behind


def test_concurrent_resolves_agree_and_leave_one_directory(tmp_path: Path) -> None:
    with ThreadPoolExecutor(max_workers=4) as pool:
        paths = list(pool.map(lambda _: resolve_model("builtin:tiny", cache_dir=str(tmp_path)), range(4)))
    assert len(set(paths)) == 1
    assert os.listdir(tmp_path / "models") == [paths[0].name]
    assert AutoConfig.from_pretrained(paths[0]).vocab_size == 98


def test_registered_builtin_resolves(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(models, "BUILTIN_MODELS", dict(models.BUILTIN_MODELS))
    spec = TinyModelSpec(arch="llama", num_layers=1)
    register_builtin(
        "tiny-llama",
        BuiltinModel(
            build=lambda out, *, cache_dir: build_tiny_model(out, spec=spec), fingerprint=spec.fingerprint()
        ),
    )
    path = resolve_model("builtin:tiny-llama", cache_dir=str(tmp_path))
    assert path.name == f"tiny-llama-{spec.fingerprint()}"
    assert AutoConfig.from_pretrained(path).model_type == "llama"


def test_resolve_errors_are_clear(tmp_path: Path) -> None:
    with pytest.raises(
        ModelResolveError, match=r"unknown builtin model 'builtin:nope'; known: .*builtin:tiny"
    ):
        resolve_model("builtin:nope", cache_dir=str(tmp_path))
    with pytest.raises(ModelResolveError, match="does not exist"):
        resolve_model(str(tmp_path / "missing"), cache_dir=str(tmp_path))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelResolveError, match="no config.json"):
        resolve_model(str(tmp_path / "empty"), cache_dir=str(tmp_path))
    assert resolve_model(
        str(build_tiny_model(tmp_path / "m", spec=TinyModelSpec(num_layers=1))), cache_dir=""
    ) == (tmp_path / "m")
