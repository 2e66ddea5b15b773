"""What the bench scripts share: environment defaults, where output goes and how it is written, timing helpers
and running a function in a fresh process (a free port is `exgrpo.transport.ranks.free_port`).

Imports nothing heavy (no torch, Ray or vLLM), so a script can call `env_defaults` before it imports them.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from exgrpo.core import metric_names as M

ROOT = Path(__file__).resolve().parents[1]
OUT_DIR = ROOT / "bench" / "out"  # ignored by git (.gitignore)
TORCH_EXTENSIONS_DIR = "~/.cache/exgrpo/torch_extensions"  # where DeepSpeed's compiled ops are cached
# A step's time split, as the driver records it: generation wait, entropy scoring, update, weight sync, idle.
STEP_SPLIT = [M.WAIT_TIME, M.UPDATE_TIME, M.SYNC_TIME, M.IDLE_TIME]

T = TypeVar("T")


def env_defaults(
    *,
    ray: bool = False,
    one_thread: bool = False,
    tokenizers: bool = False,
    vllm_cpu: bool = False,
    torch_extensions: bool = False,
) -> None:
    """Set the chosen environment defaults (a value already set wins); call it before importing Ray, torch or
    vLLM. ray: a local cluster without token auth; one_thread: one OpenMP / MKL thread; tokenizers: no
    tokenizer thread pool; vllm_cpu: vLLM-CPU in-process with a 1 GiB KV cache; torch_extensions: DeepSpeed's
    op cache under ~/.cache/exgrpo."""
    values: dict[str, str] = {}
    if ray:
        values["RAY_AUTH_MODE"] = "disabled"
    if one_thread:
        values |= {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    if tokenizers:
        values["TOKENIZERS_PARALLELISM"] = "false"
    if vllm_cpu:
        values |= {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "1"}
    if torch_extensions:
        values["TORCH_EXTENSIONS_DIR"] = os.path.expanduser(TORCH_EXTENSIONS_DIR)
    for name, value in values.items():
        os.environ.setdefault(name, value)


def write_json(path: str | Path, data: Any, *, indent: int | None = 2) -> Path:
    """Write ``data`` as JSON to ``path``, creating its folder; returns the path."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=indent))
    return out


def print_json(data: Any) -> None:
    """One JSON line on stdout, flushed (a long run's figures show as they come)."""
    print(json.dumps(data), flush=True)


@dataclass
class Elapsed:
    """Seconds of a `stopwatch` block: set when the block ends."""

    s: float = 0.0


@contextmanager
def stopwatch() -> Iterator[Elapsed]:
    """``with stopwatch() as t: ...`` then ``t.s`` is the block's wall time (perf_counter)."""
    elapsed = Elapsed()
    start = time.perf_counter()
    try:
        yield elapsed
    finally:
        elapsed.s = time.perf_counter() - start


def synchronize(device: Any) -> None:
    """Wait for a CUDA device's queued work before reading the clock; nothing on CPU."""
    if device.type == "cuda":
        import torch

        torch.cuda.synchronize(device)


def in_child(func: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """func(*args, **kwargs) run in a fresh spawned process (no Ray, torch or thread state leaks between runs)."""
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(func, *args, **kwargs).result()
