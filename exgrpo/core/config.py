"""The configuration: a typed tree of small sections, YAML files plus dotted overrides.

The public face of the config: every name callers use is importable from here. The tree itself (one
frozen section per role, each field documented by its trailing comment) is
`exgrpo.core.config_sections`; the numeric ranges (`BOUNDS`) and the rules across fields (`validate`)
are `exgrpo.core.config_checks`; this module reads a YAML-shaped dict into the tree, checking each
key and value against its field's type, and names the `builtin:` specs. Invalid values and
combinations fail at load time with a `ConfigError` that names the field and says what to change.
Load order: the packaged default (`exgrpo/configs/default.yaml`), then the user's YAML file, then
`key.sub=value` overrides (`config_files.py`).
"""

from __future__ import annotations

import contextlib
import difflib
from dataclasses import fields
from typing import Any, Literal, get_args, get_origin, get_type_hints

from exgrpo.core.config_checks import BOUNDS, field_name, setting, validate
from exgrpo.core.config_sections import (
    LOGGING_BACKENDS,
    LORA_TARGETS,
    AsyncConfig,
    ChecksConfig,
    Config,
    ConfigError,
    DataConfig,
    Dtype,
    EngineKind,
    FreshTake,
    LearnerConfig,
    LoggingConfig,
    LossConfig,
    ModelConfig,
    ReplayConfig,
    RewardConfig,
    RewardMode,
    SamplerConfig,
    TemplateName,
    TrainerConfig,
    yaml_key,
)

__all__ = [
    "BOUNDS",
    "BUILTIN_PREFIX",
    "LOGGING_BACKENDS",
    "LORA_TARGETS",
    "AsyncConfig",
    "ChecksConfig",
    "Config",
    "ConfigError",
    "DataConfig",
    "Dtype",
    "EngineKind",
    "FreshTake",
    "LearnerConfig",
    "LoggingConfig",
    "LossConfig",
    "ModelConfig",
    "ReplayConfig",
    "RewardConfig",
    "RewardMode",
    "SamplerConfig",
    "TemplateName",
    "TrainerConfig",
    "builtin_name",
    "did_you_mean",
    "from_dict",
    "parse_sections",
    "setting",
    "validate",
    "yaml_key",
]


def did_you_mean(key: Any, options: list[str]) -> str:
    """The tail of an unknown-key error: the closest valid key, or the list of valid ones."""
    close = difflib.get_close_matches(str(key), options, n=1)
    return f"; did you mean {close[0]!r}?" if close else f"; valid keys: {', '.join(options)}"


def _coerce(value: Any, tp: Any, where: str) -> Any:
    """Check/convert one YAML value against a field type; raise ConfigError naming `where`."""
    origin = get_origin(tp)
    if origin is Literal:
        if isinstance(value, bool) and ("on" if value else "off") in get_args(tp):
            value = "on" if value else "off"  # YAML 1.1 reads a bare on/off as a boolean
        if value not in get_args(tp):
            raise ConfigError(f"{where}={value!r} is not allowed; choose one of {list(get_args(tp))}")
        return value
    if origin in (tuple,):
        if not isinstance(value, list | tuple) or len(value) != len(get_args(tp)):
            raise ConfigError(f"{where} must be a list of {len(get_args(tp))} numbers, got {value!r}")
        return tuple(_coerce(v, a, where) for v, a in zip(value, get_args(tp), strict=True))
    args = get_args(tp)
    if args and type(None) in args:  # Optional[X]
        if value is None:
            return None
        return _coerce(value, next(a for a in args if a is not type(None)), where)
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where} must be true or false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where} must be an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, str):  # YAML 1.1 reads 1e-4 (no dot) as a string
            with contextlib.suppress(ValueError):
                value = float(value)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{where} must be a number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where} must be a string, got {value!r}")
        return value
    return value


def parse_sections(data: Any) -> dict[str, Any]:
    """The sections of a nested dict, each built from known keys and values of the field's type.

    Returns {Config field name: section}; unknown sections and keys, values of the wrong type and
    invalid logging backends raise ConfigError. Checks one source (a file, an override) on its own,
    so `exgrpo.core.config_files` can name the source of a typo; cross-field checks are `validate`'s.
    """
    if not isinstance(data, dict):
        raise ConfigError(f"a config must be a mapping of sections, got {type(data).__name__}")
    _no_unknown_keys(data)
    sections: dict[str, Any] = {}
    hints = get_type_hints(Config)
    for key, value in data.items():
        name = field_name(Config, key)
        assert name is not None  # _no_unknown_keys
        cls = hints[name]
        if value is None:
            value = {}
        if not isinstance(value, dict):
            raise ConfigError(f"config section {key!r} must be a mapping, got {value!r}")
        sub_hints = get_type_hints(cls)
        kwargs = {sub: _coerce(v, sub_hints[sub], f"{key}.{sub}") for sub, v in value.items()}
        sections[name] = cls(**kwargs)
    return sections


def _no_unknown_keys(data: dict[Any, Any]) -> None:
    """Raise one ConfigError naming every unknown section and key of `data`, each with its closest valid
    name (a typo or two in a file are all reported at once, not one per try)."""
    top_keys = [yaml_key(f.name) for f in fields(Config)]
    hints = get_type_hints(Config)
    unknown: list[str] = []
    for key, value in data.items():
        name = field_name(Config, key)
        if name is None:
            unknown.append(f"unknown config section {key!r}{did_you_mean(key, top_keys)}")
        elif isinstance(value, dict):
            sub_keys = [f.name for f in fields(hints[name])]
            unknown += [
                f"unknown config key {key}.{sub}{_nearest(sub, sub_keys, hints)}"
                for sub in value
                if sub not in sub_keys
            ]
    if len(unknown) == 1:
        raise ConfigError(unknown[0])
    if unknown:
        kinds = sorted({u.split()[2] for u in unknown})  # key, section
        listed = "\n".join(f"  {u.removeprefix('unknown config ')}" for u in unknown)
        raise ConfigError(f"{len(unknown)} unknown config {' and '.join(k + 's' for k in kinds)}:\n{listed}")


def _nearest(sub: Any, sub_keys: list[str], hints: dict[str, Any]) -> str:
    """The tail of an unknown-key error: the closest key of its own section; else the same key, or else the
    closest one, in another section (`trainer.lr`: `learners.lr`); else the section's valid keys."""
    if difflib.get_close_matches(str(sub), sub_keys, n=1):
        return did_you_mean(sub, sub_keys)
    others = {f"{yaml_key(f.name)}.{g.name}": g.name for f in fields(Config) for g in fields(hints[f.name])}
    same = [full for full, name in others.items() if name == sub]
    near = same or difflib.get_close_matches(str(sub), list(others.values()), n=1)
    homes = same or [full for full, name in others.items() if near and name == near[0]]
    return f"; did you mean {' or '.join(homes)}?" if homes else did_you_mean(sub, sub_keys)


def from_dict(data: dict[str, Any]) -> Config:
    """Build and validate a Config from a nested dict (unknown keys are errors)."""
    cfg = Config(**parse_sections(data))
    validate(cfg)
    return cfg


BUILTIN_PREFIX = "builtin:"


def builtin_name(spec: str) -> str | None:
    """`"builtin:arith"` -> `"arith"` (a builtin task or model); None for anything else (a path)."""
    return spec[len(BUILTIN_PREFIX) :] if spec.startswith(BUILTIN_PREFIX) else None
