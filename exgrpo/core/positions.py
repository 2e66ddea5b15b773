"""The engine context of a run and the model's position limit (pure: reads and writes `config.json` only).

A run's context is `model.max_prompt_len + model.max_response_len`; `check_context` fails before anything
starts when it exceeds the model's `max_position_embeddings`, naming the override (`model.max_position_embeddings`,
`model.rope_theta`). `positioned_model` applies the override once, as a sibling model directory whose
`config.json` carries it (its other files symlinked): learners, samplers, checkpoints and `exgrpo.evaluate` all
load that directory, so they agree by construction. Settings: docs/config.md; tests: tests/exgrpo/core/test_config.py.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from exgrpo.core.config import ConfigError, ModelConfig
from exgrpo.core.fileio import atomic_path

OVERRIDE_HINT = (
    "raise the limit with model.max_position_embeddings=N (and the RoPE base with model.rope_theta, "
    "e.g. 40000 as the official Qwen2.5-Math-7B recipe does with 16384 positions)"
)


def context_len(model: ModelConfig) -> int:
    """Tokens one sequence may hold in the engines: prompt budget + response budget (vLLM's `max_model_len`)."""
    return model.max_prompt_len + model.max_response_len


def read_config(model_dir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """A model directory's `config.json`, or None when there is none (e.g. a stand-in model in tests)."""
    if not str(model_dir):
        return None
    path = Path(model_dir) / "config.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def position_limit(config: dict[str, Any]) -> int | None:
    """`max_position_embeddings` of a config (of its `text_config` for a multimodal one); None if unset."""
    for section in (config, config.get("text_config") or {}):
        value = section.get("max_position_embeddings") if isinstance(section, dict) else None
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def effective_limit(model: ModelConfig, model_dir: str | os.PathLike[str]) -> int | None:
    """The position limit the run's engines will have: the override, else the model's own (None: unknown)."""
    if model.max_position_embeddings is not None:
        return model.max_position_embeddings
    config = read_config(model_dir)
    return None if config is None else position_limit(config)


def context_error(
    model: ModelConfig, model_dir: str | os.PathLike[str], *, limit: int | None = None
) -> str | None:
    """Why the run's context does not fit the model's positions, or None when it does (or is unknown)."""
    limit = effective_limit(model, model_dir) if limit is None else limit
    need = context_len(model)
    if limit is None or need <= limit:
        return None
    where = (
        f"model.max_position_embeddings={limit}"
        if model.max_position_embeddings is not None
        else f"the model's max_position_embeddings={limit} ({Path(model_dir) / 'config.json'})"
    )
    return (
        f"model.max_prompt_len + model.max_response_len = {model.max_prompt_len} + {model.max_response_len} "
        f"= {need} tokens do not fit {where}: the engines would cut responses short. Shorten "
        f"model.max_prompt_len/max_response_len, or {OVERRIDE_HINT}; at least "
        f"model.max_position_embeddings={need}"
    )


def check_context(model: ModelConfig, model_dir: str | os.PathLike[str]) -> None:
    """Raise `ConfigError` when prompt + response budgets exceed the position limit (see `context_error`)."""
    if (msg := context_error(model, model_dir)) is not None:
        raise ConfigError(msg)


def has_override(model: ModelConfig) -> bool:
    return model.max_position_embeddings is not None or model.rope_theta is not None


def apply_override(
    config: dict[str, Any], *, max_position_embeddings: int | None, rope_theta: float | None
) -> dict[str, Any]:
    """A copy of an HF config dict with the position limit and RoPE base replaced (None: keep the model's).

    A nested `text_config` (multimodal wrappers) is edited where it holds the values. RoPE's base sits at the
    top-level `rope_theta` (files transformers 4 wrote, e.g. Qwen2.5-Math) and/or `rope_parameters["rope_theta"]`
    (transformers 5, whose loader moves a top-level `rope_theta` there only when that is absent): every place
    present is set, and a config with neither gets a top-level `rope_theta` (read by both)."""
    out = json.loads(json.dumps(config))
    targets = [out]
    if isinstance(out.get("text_config"), dict) and "max_position_embeddings" not in out:
        targets = [out["text_config"]]
    for section in targets:
        if max_position_embeddings is not None:
            section["max_position_embeddings"] = int(max_position_embeddings)
        if rope_theta is not None:
            rope = section.get("rope_parameters")
            if isinstance(rope, dict) and any(isinstance(v, dict) for v in rope.values()):
                raise ConfigError(
                    "model.rope_theta: this model keeps one RoPE setting per layer type (nested "
                    "rope_parameters); edit its config.json instead"
                )
            if isinstance(rope, dict):
                rope["rope_theta"] = float(rope_theta)
            if "rope_theta" in section or not isinstance(rope, dict):
                section["rope_theta"] = float(rope_theta)
    return out


def positioned_model(
    model: ModelConfig, model_dir: str | os.PathLike[str], *, out_root: str | os.PathLike[str]
) -> str:
    """The model directory the run's roles load: `model_dir` itself without an override (or when its
    config already has the override's values, e.g. a resumed run's checkpoint), else
    `<out_root>/positioned-<hash>/` with the edited `config.json` and symlinks to every other file.

    Written atomically and reused when it exists (the hash covers the source path and the new config)."""
    src = Path(model_dir).resolve()
    config = read_config(src)
    if not has_override(model) or config is None:
        return str(model_dir)
    edited = apply_override(
        config, max_position_embeddings=model.max_position_embeddings, rope_theta=model.rope_theta
    )
    if edited == config:
        return str(model_dir)
    text = json.dumps(edited, indent=2, sort_keys=True) + "\n"
    key = hashlib.sha256(f"{src}\n{text}".encode()).hexdigest()[:12]
    target = Path(out_root).expanduser() / f"positioned-{key}"
    if (target / "config.json").exists() and all(p.exists() for p in target.iterdir()):
        return str(target)
    stale = target.exists()  # a copy whose sources are gone is replaced; a concurrent writer's new one wins
    with atomic_path(target, directory=True, exist_ok=not stale) as tmp:
        for f in src.iterdir():
            if f.name != "config.json":
                (tmp / f.name).symlink_to(f.resolve())
        (tmp / "config.json").write_text(text)
    return str(target)
