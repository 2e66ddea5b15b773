"""Stops a vLLM engine core that outlives its sampler: `python -m actors.reaper PARENT PID:START ...`.

With `samplers.engine_process=child` vLLM runs its engine core (and its workers) in processes of their own.
Ray ends an actor with SIGKILL (`ray.kill`, a replaced sampler, the end of a run), which gives vLLM no chance
to stop them: they are re-parented to init and keep their memory (seen here: 2.6 GB each on CPU; on a GPU,
the device memory a replacement sampler needs). `start_reaper` starts this small watcher in a session of its
own (outside the actor's process group); once the sampler's process is gone it SIGKILLs the recorded
processes that are still the ones it recorded (pid and start time, so a reused pid is left alone), then exits.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Sequence

import psutil

POLL_S = 1.0


def _same(pid: int, started: float) -> psutil.Process | None:
    try:
        proc = psutil.Process(pid)
        return proc if abs(proc.create_time() - started) < 1e-3 else None
    except psutil.Error:
        return None


def children() -> list[tuple[int, float]]:
    """(pid, start time) of every process below this one (the engine core and its workers)."""
    out = []
    for proc in psutil.Process().children(recursive=True):
        try:
            out.append((proc.pid, proc.create_time()))
        except psutil.Error:
            continue
    return out


def start_reaper(pids: Sequence[tuple[int, float]]) -> subprocess.Popen | None:
    """Watch this process; when it is gone, kill `pids` (the engine core's processes). None if none given."""
    if not pids:
        return None
    me = psutil.Process()
    args = [str(me.pid) + ":" + repr(me.create_time()), *(f"{p}:{t!r}" for p, t in pids)]
    return subprocess.Popen(
        [sys.executable, "-m", "actors.reaper", *args],
        start_new_session=True,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def reap(parent: tuple[int, float], pids: Sequence[tuple[int, float]], *, poll_s: float = POLL_S) -> int:
    """Wait for `parent` to end, then SIGKILL what is left of `pids`; returns how many were killed."""
    while _same(*parent) is not None:
        time.sleep(poll_s)
    killed = 0
    for pid, started in pids:
        proc = _same(pid, started)
        if proc is not None:
            try:
                proc.kill()
                killed += 1
            except psutil.Error:
                pass
    return killed


def _parse(arg: str) -> tuple[int, float]:
    pid, _, started = arg.partition(":")
    return int(pid), float(started)


if __name__ == "__main__":
    reap(_parse(sys.argv[1]), [_parse(a) for a in sys.argv[2:]])
