"""Finding a user's reward function from its `reward.fn` spec (stdlib only: the worker processes import it).

A spec is `package.module:function` (imported like any module) or `path/to/file.py:function` (loaded from
that file; a relative path is read from the current directory, which under `ray job submit --working-dir .`
is the job's copy of that directory on every node). The function is called as

    fn(prompt: str, completion: str, fields: dict) -> float

where `prompt` is the question text before any template, `completion` the generated text and `fields` the
row's columns (`answer`, `qid`, `data_source` and every extra column of the dataset row). `resolve` checks
the function exists and takes those three arguments, and returns the directory its imports need on the
path (`import_root`), so the verification workers load it exactly as the sampler did.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from exgrpo.verify import closure

RewardFn = Callable[[str, str, dict[str, Any]], Any]


class RewardError(ValueError):
    """A `reward.fn` that cannot be used: malformed spec, missing module or function, wrong signature."""


@dataclass(frozen=True)
class ResolvedReward:
    spec: str
    fn: RewardFn
    import_root: (
        str | None
    )  # directory to put on sys.path of a process that imports it (None: already importable)


def _split(spec: str) -> tuple[str, str]:
    where, sep, name = spec.rpartition(":")
    if not sep or not where or not name.isidentifier():
        raise RewardError(
            f"reward.fn={spec!r} must look like package.module:function or path/to/file.py:function "
            "(or 'math', the built-in verifier)"
        )
    return where, name


def _load_file(path: str) -> tuple[Any, str]:
    file = Path(path).expanduser()
    if not file.is_file():
        raise RewardError(
            f"reward.fn: no such file {str(file)!r} (relative paths are read from {os.getcwd()})"
        )
    name = "exgrpo_reward_" + file.stem.replace("-", "_")
    module_spec = importlib.util.spec_from_file_location(name, file)
    if module_spec is None or module_spec.loader is None:
        raise RewardError(f"reward.fn: {str(file)!r} is not a Python file")
    module = importlib.util.module_from_spec(module_spec)
    root = str(file.resolve().parent)
    if root not in sys.path:  # its own sibling imports, as when run as a script
        sys.path.insert(0, root)
    try:
        module_spec.loader.exec_module(module)
    except Exception as err:
        raise RewardError(f"reward.fn: importing {str(file)!r} failed: {err!r}") from err
    return module, root


def _load_module(dotted: str) -> tuple[Any, str | None]:
    try:
        module = importlib.import_module(dotted)
    except ModuleNotFoundError as err:
        raise RewardError(
            f"reward.fn: cannot import {dotted!r} ({err}); run from the directory that holds it, put it on "
            "PYTHONPATH, or give a file path such as my_rewards.py:score"
        ) from err
    except Exception as err:
        raise RewardError(f"reward.fn: importing {dotted!r} failed: {err!r}") from err
    file = getattr(module, "__file__", None)
    if not file:
        return module, None
    root = Path(file).resolve().parent
    for _ in range(dotted.count(".") + (1 if Path(file).name == "__init__.py" else 0)):
        root = root.parent
    return module, str(root)


def resolve(spec: str) -> ResolvedReward:
    """Import the function a spec names and check it can be called as fn(prompt, completion, fields)."""
    if spec.startswith(closure.PREFIX):  # a callable shipped by value (the Python API's reward_fn)
        try:
            fn: Any = closure.unpack(spec)
        except Exception as err:
            raise RewardError(f"reward.fn: cannot unpickle the reward function: {err!r}") from err
        return ResolvedReward(spec=spec, fn=_checked_signature(fn, "reward_fn"), import_root=None)
    where, name = _split(spec)
    module, root = _load_file(where) if where.endswith(".py") else _load_module(where)
    fn = getattr(module, name, None)
    if fn is None:
        public = sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_"))
        raise RewardError(
            f"reward.fn: {where!r} has no {name!r}; its functions: {', '.join(public) or 'none'}"
        )
    if not callable(fn):
        raise RewardError(f"reward.fn: {spec!r} is not a function")
    return ResolvedReward(spec=spec, fn=_checked_signature(fn, repr(spec)), import_root=root)


def _checked_signature(fn: RewardFn, name: str) -> RewardFn:
    try:
        inspect.signature(fn).bind("prompt", "completion", {})
    except TypeError as err:
        raise RewardError(
            f"reward.fn: {name} must accept (prompt, completion, fields); its signature is "
            f"{inspect.signature(fn)} ({err})"
        ) from err
    except ValueError:  # a builtin without a signature: let the call decide
        pass
    return fn
