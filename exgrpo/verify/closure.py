"""A reward given as a Python callable (the Python API's `reward_fn`), shipped by value to the verifier workers.

`pack(fn)` cloudpickles the callable (a closure, a lambda, a function of the caller's own script or module:
all by value, with what they capture) into the spec `cloudpickle:<zlib + base64>`, which travels like any
`reward.fn` spec: in the config to every sampler, and in an environment variable to each verifier worker
process, which `unpack`s it. It is then run exactly like a `reward.fn` function: under the verifier's
deadline, isolated in those processes, a raise or a non-finite value scored 0 and counted.

`Weighted` sums several rewards with weights (`train(reward_fn=[(f, 1.0), (g, 0.5)])`): one call of it is one
reward call, so a part that raises or hangs fails the whole call (scored 0, counted once).
"""

from __future__ import annotations

import base64
import sys
import zlib
from collections.abc import Callable, Sequence
from typing import Any

PREFIX = "cloudpickle:"
# an environment variable carries the spec to each worker process (Linux: 128 KiB per string)
MAX_SPEC_CHARS = 96 * 1024

RewardCallable = Callable[[str, str, dict[str, Any]], Any]


class Weighted:
    """sum(weight * float(fn(prompt, completion, fields))) over its parts."""

    def __init__(self, parts: Sequence[tuple[RewardCallable, float]]) -> None:
        self.parts = [(fn, float(w)) for fn, w in parts]

    def __call__(self, prompt: str, completion: str, fields: dict[str, Any]) -> float:
        return sum(w * float(fn(prompt, completion, fields)) for fn, w in self.parts)


def combine(reward_fn: RewardCallable | Sequence[Any]) -> RewardCallable:
    """One callable from a callable or a list of callables and (callable, weight) pairs (weight 1 if none)."""
    if callable(reward_fn):
        return reward_fn
    parts: list[tuple[RewardCallable, float]] = []
    for item in reward_fn:
        if callable(item):
            parts.append((item, 1.0))
        elif isinstance(item, tuple | list) and len(item) == 2 and callable(item[0]):
            parts.append((item[0], float(item[1])))
        else:
            raise TypeError(
                f"reward_fn: {item!r} is neither a callable nor a (callable, weight) pair; give "
                "fn, [fn, ...] or [(fn, weight), ...]"
            )
    if not parts:
        raise TypeError("reward_fn: an empty list")
    return parts[0][0] if len(parts) == 1 and parts[0][1] == 1.0 else Weighted(parts)


def _by_value_modules(fn: Any) -> list[Any]:
    """The caller's own modules that `fn` (or a part of a Weighted) lives in: pickled by value, since a worker
    process cannot import the caller's script or test module (installed packages stay by reference)."""
    fns = [f for f, _ in fn.parts] if isinstance(fn, Weighted) else [fn]
    out = []
    for f in fns:
        name = getattr(f, "__module__", None) or getattr(type(f), "__module__", None)
        module = sys.modules.get(name or "")
        file = getattr(module, "__file__", None) or ""
        if module is None or name in ("__main__", "builtins") or not file:
            continue
        if "site-packages" in file or name.split(".")[0] == "exgrpo" or name in sys.stdlib_module_names:
            continue
        if module not in out:
            out.append(module)
    return out


def pack(fn: RewardCallable) -> str:
    """The `reward.fn` spec carrying `fn` by value."""
    import cloudpickle

    modules = [
        m for m in _by_value_modules(fn) if m.__name__ not in cloudpickle.list_registry_pickle_by_value()
    ]
    for m in modules:
        cloudpickle.register_pickle_by_value(m)
    try:
        data = cloudpickle.dumps(fn)
    except Exception as err:
        raise TypeError(f"reward_fn cannot be pickled with cloudpickle: {err!r}") from err
    finally:
        for m in modules:
            cloudpickle.unregister_pickle_by_value(m)
    spec = PREFIX + base64.b64encode(zlib.compress(data, 9)).decode("ascii")
    if len(spec) > MAX_SPEC_CHARS:
        raise TypeError(
            f"reward_fn pickles to {len(spec)} characters (limit {MAX_SPEC_CHARS}): it captures large objects; "
            "load them inside the function, or give reward.fn=module:function (docs/rewards.md)"
        )
    return spec


def unpack(spec: str) -> RewardCallable:
    """The callable a `cloudpickle:` spec carries."""
    import cloudpickle

    fn = cloudpickle.loads(zlib.decompress(base64.b64decode(spec[len(PREFIX) :])))
    if not callable(fn):
        raise TypeError(f"{PREFIX} spec holds {type(fn).__name__}, not a function")
    return fn  # type: ignore[no-any-return]


def describe(spec: str) -> str:
    """A short name for a spec in messages (a packed callable's spec is long)."""
    return f"{PREFIX}<{len(spec)} chars>" if spec.startswith(PREFIX) else spec
