"""`resolve_model`: a model path, a hub model id or `builtin:<name>` -> an HF model directory.

Builtins are built once into `<cache_dir>/models/<name>-<fingerprint>` (atomically, safe across processes) or, for
the scratchpad bases, taken from the package (`exgrpo.models.shipped`); a hub id `org/name[@revision]` resolves to
the snapshot directory of one commit (`resolve_hub`), so everything that loads it loads the same revision; a path
must be a complete HF model directory (`check_model_dir` fails before any actor starts). More: docs/config.md
(`model.path`), docs/base-model.md; tests: tests/exgrpo/models/test_models.py, tests/exgrpo/models/test_hub_models.py.
"""

from __future__ import annotations

import os
import re
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
    """The HF model directory for `path`: a builtin (built once, then reused), an existing directory or a hub
    model id (`resolve_hub`).

    Builtins are built in a temporary directory next to the target and renamed into place, so
    several processes may resolve at once: one rename wins, the others discard their build.
    """
    name = builtin_name(path)
    if name is not None and name in MANIFEST:
        return shipped_model(name)
    if name is not None:
        if name not in BUILTIN_MODELS:
            raise ModelResolveError(f"unknown builtin model {path!r}; known: {known_models()}")
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
    if not model_dir.is_dir() and hub_id(path) is not None:
        return resolve_hub(path).path
    if not model_dir.is_dir():
        raise ModelResolveError(
            f"model path {path!r} does not exist; give an HF model directory, a hub model id "
            f"(org/name or org/name@revision) or one of {known_models()}"
        )
    check_model_dir(model_dir, spec=path)
    return model_dir


# org/name[@revision]: the hub's repo id rules (letters, digits, '-', '_', '.'), a revision is a branch, tag or commit
HUB_ID = re.compile(r"(?P<repo>[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*)(?:@(?P<revision>[\w./-]+))?")
# what a training run never reads from a model repo (other frameworks' weights, GGUF, original checkpoints)
HUB_IGNORE = ["*.h5", "*.msgpack", "*.ot", "*.onnx", "*.gguf", "*.pth", "original/*", "onnx/*"]


def hub_id(spec: str) -> tuple[str, str | None] | None:
    """(repo id, revision or None) when `spec` reads as a hub model id `org/name[@revision]`, else None."""
    if builtin_name(spec) is not None or spec.startswith(("/", ".", "~")):
        return None
    match = HUB_ID.fullmatch(spec)
    return (match["repo"], match["revision"]) if match else None


@dataclass(frozen=True)
class HubModel:
    """A hub model id resolved to one commit's snapshot directory in the local hub cache."""

    spec: str  # as given: org/name or org/name@revision
    repo_id: str
    revision: str | None  # as given (None: the default branch)
    commit: str  # the commit the snapshot holds (its directory name)
    path: Path  # <hub cache>/models--org--name/snapshots/<commit>
    downloaded: bool  # False: it was in the cache already


def cached_hub(spec: str) -> HubModel | None:
    """Hub model id `spec` from the hub cache alone (no network call): its snapshot, or None when the cache
    holds none. Raises `ModelResolveError` for a malformed id or an unusable cached snapshot."""
    parsed = hub_id(spec)
    if parsed is None:
        raise ModelResolveError(f"{spec!r} is not a hub model id (org/name or org/name@revision)")
    repo_id, revision = parsed
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    try:
        path = Path(snapshot_download(repo_id, revision=revision, local_files_only=True))
    except LocalEntryNotFoundError:
        return None
    except (RepositoryNotFoundError, RevisionNotFoundError, GatedRepoError, HfHubHTTPError) as err:
        raise ModelResolveError(f"model {spec!r}: {err}") from err
    check_model_dir(path, spec=spec)
    return HubModel(
        spec=spec, repo_id=repo_id, revision=revision, commit=path.name, path=path, downloaded=False
    )


def hub_offline() -> bool:
    """Whether the hub client is offline (HF_HUB_OFFLINE, read when it was imported)."""
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


def not_cached_fix(repo_id: str, revision: str | None) -> str:
    """How to get a hub model id the cache does not hold onto this machine."""
    from huggingface_hub import constants

    rev = f" --revision {revision}" if revision else ""
    return (
        f"download it where the hub is reachable (`hf download {repo_id}{rev}` with the same HF_HOME, hub cache "
        f"{constants.HF_HUB_CACHE}) and run with HF_HUB_OFFLINE=1, or give this machine network access to the "
        "hub, or give a local model directory"
    )


def resolve_hub(spec: str) -> HubModel:
    """The snapshot directory of hub model id `spec` (`org/name[@revision]`): from the hub cache when it holds
    one (no network call, `cached_hub`), else downloaded with a progress bar. Offline (`HF_HUB_OFFLINE=1`) and
    not cached, or any download failure, raises `ModelResolveError` naming the id and the fix."""
    from huggingface_hub import constants

    cached = cached_hub(spec)
    if cached is not None:
        return cached
    repo_id, revision = hub_id(spec) or (spec, None)
    cache = constants.HF_HUB_CACHE
    if hub_offline():
        raise ModelResolveError(
            f"model {spec!r} is not in the hub cache ({cache}) and HF_HUB_OFFLINE is set: "
            f"{not_cached_fix(repo_id, revision)} (or unset HF_HUB_OFFLINE)"
        )
    path = _download(spec, repo_id, revision, cache)
    check_model_dir(path, spec=spec)
    return HubModel(
        spec=spec, repo_id=repo_id, revision=revision, commit=path.name, path=path, downloaded=True
    )


def _download(spec: str, repo_id: str, revision: str | None, cache: str) -> Path:
    """snapshot_download with its progress bar on (the quiet defaults turn the hub's bars off)."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )
    from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars

    quiet = are_progress_bars_disabled()
    if quiet and os.environ.get("HF_HUB_DISABLE_PROGRESS_BARS") != "1":
        enable_progress_bars()
    print(f"downloading {spec} into the hub cache {cache}", flush=True)
    try:
        return Path(snapshot_download(repo_id, revision=revision, ignore_patterns=HUB_IGNORE))
    except RepositoryNotFoundError as err:
        raise ModelResolveError(
            f"model {spec!r}: no such model on the hub, or it is private (set HF_TOKEN): {err}"
        ) from err
    except GatedRepoError as err:
        raise ModelResolveError(
            f"model {spec!r} is gated: accept its terms on the hub and set HF_TOKEN ({err})"
        ) from err
    except RevisionNotFoundError as err:
        raise ModelResolveError(f"model {spec!r}: no such revision ({err})") from err
    except (LocalEntryNotFoundError, HfHubHTTPError, OSError) as err:
        raise ModelResolveError(
            f"model {spec!r} could not be downloaded ({err}); check the network, HF_ENDPOINT and HF_TOKEN; "
            f"without network access here: {not_cached_fix(repo_id, revision)}"
        ) from err
    finally:
        if quiet:
            disable_progress_bars()


def model_record(spec: str, path: str | Path) -> dict[str, str | None]:
    """What a run records of its base model: the spec and the directory it resolved to; for a hub id, also the
    repo id, the revision asked for and the commit of the snapshot (the snapshot directory's name)."""
    parsed = hub_id(spec) if not Path(spec).expanduser().is_dir() else None
    if parsed is None:
        return {"model": spec, "path": str(path)}
    return {
        "model": spec,
        "repo_id": parsed[0],
        "revision": parsed[1],
        "commit": Path(path).name,
        "path": str(path),
    }


def known_models() -> str:
    """The builtin model names a `model.path` may give, for error messages."""
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
