"""The config as `--print-config` and report.html show it: a reward given as a Python callable by its name.

`train(reward_fn=...)` (the Python API) stores the callable in `reward.fn` as a `cloudpickle:` spec, a
base64 string of several hundred to a few thousand characters that the run's `config.yaml` must keep
(`--resume` runs it again). `shown_yaml` prints that spec as the callable's name instead:
`module:qualname` for a function of an importable module, the qualified name alone for one defined in a
script or a notebook (`make.<locals>.length_bonus`), the parts and weights of a weighted sum, each marked
`(in-memory)`. The name is read without running anything the pickle holds: `_NameReader` builds functions
and cells but neither imports a module nor calls any other global (each stands in as a `_Stub`), so printing
a config from someone else's run directory runs none of its code.
"""

from __future__ import annotations

import base64
import io
import pickle
import types
import zlib
from typing import Any

from exgrpo.core.config_sections import Config

PACKED = "cloudpickle:"  # exgrpo.verify.closure.PREFIX (core imports nothing above itself)
_CLOUDPICKLE = ("cloudpickle.cloudpickle", "cloudpickle.cloudpickle_fast")


def shown_yaml(cfg: Config) -> str:
    """`cfg.to_yaml()`, with a packed reward callable shown by name and a comment saying where it is kept."""
    spec = cfg.reward.fn
    if not spec.startswith(PACKED):
        return cfg.to_yaml()
    import yaml

    data = cfg.to_dict()
    data["reward"]["fn"] = packed_name(spec)
    return _note(spec) + yaml.safe_dump(data, sort_keys=False)


def shown_text(config_yaml: str) -> str:
    """A config's YAML text (a run's `config.yaml`, as report.html shows it) with a packed reward by its name;
    any other text as it is."""
    import yaml

    try:
        data = yaml.safe_load(config_yaml)
        spec = data["reward"]["fn"]
    except (yaml.YAMLError, KeyError, TypeError):
        return config_yaml
    if not isinstance(spec, str) or not spec.startswith(PACKED):
        return config_yaml
    data["reward"]["fn"] = packed_name(spec)
    return _note(spec) + yaml.safe_dump(data, sort_keys=False)


def _note(spec: str) -> str:
    return (
        "# reward.fn: a Python callable given to train(reward_fn=...), shown by its name;\n"
        f"# the run's config.yaml keeps the callable itself ({len(spec)} characters of cloudpickle)\n"
    )


def packed_name(spec: str) -> str:
    """The name of the callable a `cloudpickle:` spec holds (`pkg.rewards:score (in-memory)`); a spec whose
    name cannot be read without running it is named by its length."""
    try:
        raw = zlib.decompress(base64.b64decode(spec[len(PACKED) :]))
        name = _name(_NameReader(io.BytesIO(raw)).load())
    except Exception:  # noqa: BLE001 - any unreadable pickle is shown by its length
        name = ""
    return f"{name} (in-memory)" if name else f"a Python callable ({len(spec)}-character cloudpickle spec)"


def _name(obj: Any) -> str:
    parts = getattr(obj, "parts", None)
    if type(obj).__name__ == "Weighted" and isinstance(parts, list):  # exgrpo.verify.closure.Weighted
        return " + ".join(_one(fn) if w == 1.0 else f"{w:g} * {_one(fn)}" for fn, w in parts)
    return _one(obj)


def _one(fn: Any) -> str:
    if isinstance(fn, _Stub):  # a function of an installed package, kept by reference
        return fn.name
    target = fn if isinstance(fn, types.FunctionType) else type(fn)  # a callable object: its class
    module, qualname = getattr(target, "__module__", None), getattr(target, "__qualname__", "")
    if not isinstance(qualname, str) or not qualname:
        return ""
    return qualname if module in (None, "__main__") or not isinstance(module, str) else f"{module}:{qualname}"


class _Stub:
    """A global the reader does not load (a module, a class, a function): calling it, or anything on it,
    gives another stub; `name` is what the pickle named."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __call__(self, *args: Any, **kwargs: Any) -> _Stub:
        return _Stub(self.name)

    def __getattr__(self, attr: str) -> _Stub:
        return _Stub(f"{self.name}.{attr}")

    def __setitem__(self, key: Any, value: Any) -> None:
        pass

    def __setstate__(self, state: Any) -> None:
        pass


def _class_stub(_metaclass: Any, name: Any, _bases: Any, type_kwargs: Any, *_: Any) -> type:
    """cloudpickle's class by value as an empty class of that name and module (its methods never installed)."""
    module = type_kwargs.get("__module__") if isinstance(type_kwargs, dict) else None
    return type(name if isinstance(name, str) else "object", (), {"__module__": module})


def _names_only(obj: Any, state: Any) -> Any:
    """cloudpickle's `_function_setstate` / `_class_setstate`, keeping only the qualified name and module."""
    for part in state if isinstance(state, tuple) else (state,):
        for key in ("__module__", "__qualname__"):
            if isinstance(part, dict) and isinstance(part.get(key), str):
                setattr(obj, key, part[key])
    return obj


class _NameReader(pickle.Unpickler):
    """Builds what a name needs (functions, code, cells, `Weighted`) and stubs every other global."""

    def find_class(self, module: str, name: str) -> Any:
        if module in _CLOUDPICKLE:
            import cloudpickle.cloudpickle as cp

            safe = {
                "_builtin_type": cp._builtin_type,
                "_make_function": cp._make_function,
                "_function_setstate": _names_only,
                "_make_empty_cell": cp._make_empty_cell,
                "_make_cell": cp._make_cell,
                "_make_skeleton_class": _class_stub,
                "_class_setstate": _names_only,
            }
            if name in safe:
                return safe[name]
        if (module, name) == ("exgrpo.verify.closure", "Weighted"):
            return type("Weighted", (), {})  # its parts land in __dict__; nothing of it runs
        if (module, name) in (("builtins", "object"), ("builtins", "type"), ("copyreg", "_reconstructor")):
            return {"object": object, "type": type, "_reconstructor": _reconstruct}[name]
        return _Stub(f"{module}:{name}")


def _reconstruct(cls: Any, base: Any, state: Any) -> Any:
    return object.__new__(cls) if isinstance(cls, type) else _Stub("object")
