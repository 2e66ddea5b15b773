"""Config files and overrides: the packaged default (`exgrpo/configs/default.yaml`), then a user's YAML file or
packaged name, then `key.sub=value` overrides, merged and parsed into a validated `Config` (`load_config`).

YAML is read with `yaml.safe_load` only; a typo names the closest key (`from_dict` in `config.py`) and
the file or override it came from (each source's keys and types are checked on their own before the merge).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

from exgrpo.core.config import Config, ConfigError, from_dict, parse_sections

PACKAGED_CONFIGS = Path(__file__).parents[1] / "configs"  # exgrpo/configs
PROJECT_ROOT = Path(__file__).parents[
    2
]  # the checkout holding configs/ and docs/ (a packaged config's paths)
PATH_KEYS = (
    ("reward", "fn"),
    ("data", "train"),
    ("data", "eval"),
    ("model", "path"),
)  # file paths of a config


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = {k: dict(v) if isinstance(v, dict) else v for k, v in base.items()}
    for k, v in extra.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = {**out[k], **v}
        else:
            out[k] = v
    return out


def parse_override(text: str) -> dict[str, Any]:
    """`replay.rho=0.25` -> {"replay": {"rho": 0.25}} (values parsed as YAML scalars)."""
    if "=" not in text:
        raise ConfigError(f"override {text!r} must look like section.key=value (e.g. replay.rho=0.25)")
    key, raw = text.split("=", 1)
    parts = key.strip().split(".")
    if len(parts) != 2 or not all(parts):
        raise ConfigError(f"override key {key!r} must be section.key (e.g. trainer.steps=10)")
    value = _safe_yaml(raw, f"override {text!r}") if raw.strip() else ""
    return {parts[0]: {parts[1]: value}}


def _safe_yaml(text: str, where: str) -> Any:
    """yaml.safe_load with its errors as ConfigError naming `where` (a file or an override)."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ConfigError(f"{where} is not valid YAML: {err}") from err
    except RecursionError as err:
        raise ConfigError(f"{where}: YAML nested too deeply") from err


def _read_config_file(path: str | os.PathLike[str]) -> Any:
    try:
        p = resolve_config_path(path)
        text = p.read_text(encoding="utf-8")
    except ValueError as err:  # embedded NUL byte in the path; UnicodeDecodeError (not UTF-8 text)
        if isinstance(err, ConfigError):
            raise
        raise ConfigError(f"cannot read config file {str(path)!r}: {err}") from err
    except OSError as err:  # a directory, no permission
        raise ConfigError(f"cannot read config file {str(path)!r}: {err.strerror or err}") from err
    return _safe_yaml(text, f"config file {str(path)!r}")


def resolve_config_path(path: str | os.PathLike[str]) -> Path:
    """A config path as given, or the name of a packaged config (`tiny-cpu`, `default.yaml`)."""
    p = Path(path).expanduser()
    if p.exists():
        return p
    for candidate in (PACKAGED_CONFIGS / p.name, PACKAGED_CONFIGS / f"{p.name}.yaml"):
        if candidate.exists():
            return candidate
    packaged = sorted(x.stem for x in PACKAGED_CONFIGS.glob("*.yaml"))
    raise ConfigError(f"config file {str(path)!r} not found; packaged configs: {', '.join(packaged)}")


def load_config(
    path: str | os.PathLike[str] | None = None, overrides: list[str] | tuple[str, ...] = ()
) -> Config:
    """Packaged default <- YAML file <- dotted overrides, validated.

    The default's held-out set belongs to its training task: a file or override that sets `data.train`
    without `data.eval` evaluates on the new task's own held-out split (`data.eval: ""`), never on the
    default's questions.
    """
    data = yaml.safe_load((PACKAGED_CONFIGS / "default.yaml").read_text()) or {}
    layers = []
    if path is not None:
        user = _read_config_file(path) or {}
        if not isinstance(user, dict):
            raise ConfigError(f"{path}: a config file must be a mapping of sections")
        if resolve_config_path(path).resolve().parent == PACKAGED_CONFIGS.resolve():
            user = anchor_paths(user, PROJECT_ROOT)
        layers.append((user, f"config file {str(path)!r}"))
    layers += [(parse_override(text), f"override {text!r}") for text in overrides]
    return from_dict(_layered(data, _checked_all(layers)))


def apply_overrides(cfg: Config, overrides: list[str] | tuple[str, ...]) -> Config:
    """`cfg` with dotted overrides applied (as on the command line), validated."""
    layers = _checked_all([(parse_override(text), f"override {text!r}") for text in overrides])
    return from_dict(_layered(cfg.to_dict(), layers)) if layers else cfg


def _layered(data: dict[str, Any], layers: list[dict[str, Any]]) -> dict[str, Any]:
    """`data` with `layers` merged over it in order; a layer set that moves `data.train` without saying
    `data.eval` evaluates on the new task's own held-out split."""
    touched: list[dict[str, Any]] = [d for layer in layers if isinstance(d := layer.get("data"), dict)]
    if any("train" in d for d in touched) and not any("eval" in d for d in touched):
        layers = [{"data": {"eval": ""}}, *layers]
    for layer in layers:
        data = _merge(data, layer)
    return data


def anchor_paths(data: dict[str, Any], root: Path) -> dict[str, Any]:
    """A packaged config's relative file paths (`reward.fn`'s file, `data.train` / `data.eval`, `model.path`)
    read from `root`, the checkout that holds them, when they are there, so `--config length-cpu` works from
    any directory; names (`builtin:...`, `package.module:function`) and absolute paths stay as they are."""
    out = {k: dict(v) if isinstance(v, dict) else v for k, v in data.items()}
    for section, key in PATH_KEYS:
        value = (out.get(section) or {}).get(key) if isinstance(out.get(section), dict) else None
        if not isinstance(value, str) or not value or value.startswith("builtin:"):
            continue
        file, sep, name = value.rpartition(":") if section == "reward" else (value, "", "")
        if section == "reward" and not file.endswith(".py"):
            continue  # package.module:function, or math
        if not Path(file).is_absolute() and (root / file).exists():
            out[section][key] = f"{root / file}{sep}{name}"
    return out


def _checked_all(layers: list[tuple[dict[str, Any], str]]) -> list[dict[str, Any]]:
    """The layers (a file, then the overrides) after `_checked`; the errors of all of them in one ConfigError,
    so a file and an override with a typo each are both reported at once."""
    errors = []
    for data, where in layers:
        try:
            _checked(data, where)
        except ConfigError as err:
            errors.append(str(err))
    if errors:
        raise ConfigError("\n".join(errors))
    return [data for data, _ in layers]


def _checked(data: dict[str, Any], where: str) -> dict[str, Any]:
    """`data` after checking its keys and value types on their own; an error names `where` (the file or
    the override), which the merged config would no longer know."""
    try:
        parse_sections(data)
    except ConfigError as err:
        raise ConfigError(f"{where}: {err}") from None
    return data
