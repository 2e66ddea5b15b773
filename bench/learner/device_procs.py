"""Run a device-check function in spawned processes under a hard time limit: each reports ("ok" or "error",
its result or partial result, the error text); what has not reported by the limit is killed and recorded as
failed, so one stuck part never stops the others (``bench/learner/device_check.py``)."""

from __future__ import annotations

import queue
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any

ERROR_GRACE_S = 15.0  # after one rank of a pair fails, how long the other may still report


def _entry(fn: Callable[..., dict[str, Any]], rank: int | None, kwargs: dict[str, Any], results: Any) -> None:
    """Child process body: run ``fn`` and put ("ok"|"error", rank, result or partial, error text)."""
    partial: dict[str, Any] = {}

    def report(d: dict[str, Any]) -> None:
        partial.update(d)

    who = fn.__name__ if rank is None else f"{fn.__name__} rank {rank}"
    try:
        extra = {"report": report} if rank is not None else {}
        res = fn(rank, **kwargs, **extra) if rank is not None else fn(**kwargs)
        _print_memory(who)
        results.put(("ok", rank, res, None))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which fails the part loudly
        text = f"{type(exc).__name__}: {exc}"
        print(f"[rank {rank}] FAILED: {text}\n{traceback.format_exc()}", file=sys.stderr, flush=True)
        _print_memory(who)  # an out-of-memory error most of all
        results.put(("error", rank, partial, text))


def _print_memory(who: str) -> None:
    """On CUDA, the caching allocator's reserved bytes beside the allocated peak the parts report (both since
    the part's last ``reset_peak_memory_stats``): reserved minus allocated is what the cache holds back."""
    import torch

    if not torch.cuda.is_initialized():
        return
    g = 2**30
    print(
        f"[device_check] {who} memory (GiB, since its last peak reset): max_memory_allocated "
        f"{torch.cuda.max_memory_allocated() / g:.2f}, max_memory_reserved {torch.cuda.max_memory_reserved() / g:.2f}, "
        f"memory_reserved at the end {torch.cuda.memory_reserved() / g:.2f}, memory_allocated at the end "
        f"{torch.cuda.memory_allocated() / g:.2f}",
        flush=True,
    )


def run_processes(
    fn: Callable[..., dict[str, Any]],
    ranks: Sequence[int | None],
    kwargs: dict[str, Any],
    timeout_s: float,
    ctx: Any,
) -> dict[Any, tuple[str, dict[str, Any], str | None]]:
    """Spawn one process per rank, collect each one's report until ``timeout_s`` (or ``ERROR_GRACE_S``
    after a rank failed), kill what is left."""
    results = ctx.Queue()
    procs = [ctx.Process(target=_entry, args=(fn, r, kwargs, results), daemon=False) for r in ranks]
    for p in procs:
        p.start()
    begin = time.monotonic()
    deadline = begin + timeout_s
    got: dict[Any, tuple[str, dict[str, Any], str | None]] = {}
    while len(got) < len(ranks) and time.monotonic() < deadline:
        try:
            status, rank, res, err = results.get(timeout=0.5)
            got[rank] = (status, res, err)
            who = fn.__name__ if rank is None else f"{fn.__name__} rank {rank}"
            print(f"[device_check] {who}: {status} after {time.monotonic() - begin:.1f} s", flush=True)
            if status != "ok":  # the others are likely stuck waiting for this one: a short grace
                deadline = min(deadline, time.monotonic() + ERROR_GRACE_S)
        except queue.Empty:
            if not any(p.is_alive() for p in procs):
                try:  # a last message may still be in the pipe
                    status, rank, res, err = results.get(timeout=2.0)
                    got[rank] = (status, res, err)
                    continue
                except queue.Empty:
                    break
    for r, p in zip(ranks, procs, strict=True):
        p.join(timeout=10.0 if r in got else 0.1)  # a reported rank may take a while to exit
        if p.is_alive():
            print(
                f"[device_check] killing rank {r} (pid {p.pid}): past its time limit",
                file=sys.stderr,
                flush=True,
            )
            p.kill()
            p.join(timeout=5.0)
        if r not in got:
            why = "time limit" if time.monotonic() >= deadline else f"exit code {p.exitcode}"
            got[r] = ("error", {}, f"no report ({why})")
    return got
