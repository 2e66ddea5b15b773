"""Cores lent on one node: a sampler's core is idle between its generate calls, and a learner on the same node may
run its torch threads there until the sampler generates again (plain Python: no Ray, no torch).

A ledger is a small file in /dev/shm (``ledger_path``), one per Ray job, holding ``SLOTS`` records of
(pid, cores, busy) as int32. A sampler registers as a ``Lender`` (its pid and the cores it was given) and marks
itself busy around each engine call; a ``Borrower`` (a learner) reads the ledger between its micro-batches and sizes
its threads to its own cores plus the cores of the live, idle lenders, never past the cores this process may run
on. A lender that dies without closing its slot lends nothing (its pid is gone) and its slot is taken again.
A sampler that starts generating while a learner holds its core gets it back at the learner's next micro-batch.
"""

from __future__ import annotations

import contextlib
import fcntl
import math
import mmap
import os
import re
import struct
import time
from collections.abc import Callable, Iterator
from pathlib import Path

SLOTS = 64
RECORD = struct.Struct("iii")  # pid, cores, busy
SIZE = SLOTS * RECORD.size
SHM = Path("/dev/shm")


def ledger_path(job: str, root: Path = SHM) -> Path:
    """The node's ledger of the Ray job ``job`` (its id, hex)."""
    return root / f"exgrpo-cores-{re.sub(r'[^0-9A-Za-z_-]', '_', job)}"


def node_cores() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True


class _Ledger:
    """The mapped file; writers take the file lock, readers read the int32 fields as they are."""

    def __init__(self, path: Path) -> None:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            with self.locked(fd):
                if os.fstat(fd).st_size < SIZE:
                    os.ftruncate(fd, SIZE)
            self._map = mmap.mmap(fd, SIZE)
        finally:
            os.close(fd)
        self.path = path

    @staticmethod
    @contextlib.contextmanager
    def locked(fd: int) -> Iterator[None]:
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)

    def read(self, slot: int) -> tuple[int, int, int]:
        return RECORD.unpack_from(self._map, slot * RECORD.size)

    def write(self, slot: int, pid: int, cores: int, busy: int) -> None:
        RECORD.pack_into(self._map, slot * RECORD.size, pid, cores, busy)

    def claim(self, pid: int, cores: int) -> int:
        """A free slot (never used, or its pid gone) for ``pid``, marked busy."""
        fd = os.open(self.path, os.O_RDWR)
        try:
            with self.locked(fd):
                for slot in range(SLOTS):
                    owner = self.read(slot)[0]
                    if owner == 0 or not _alive(owner):
                        self.write(slot, pid, cores, 1)
                        return slot
        finally:
            os.close(fd)
        raise RuntimeError(f"{self.path}: all {SLOTS} slots hold live samplers")


class Lender:
    """A sampler's slot: busy from registration until the first ``mark(False)``, then as marked."""

    def __init__(self, path: Path, *, cores: int) -> None:
        self._ledger, self._cores, self._pid = _Ledger(path), max(int(cores), 0), os.getpid()
        self._slot = self._ledger.claim(self._pid, self._cores)

    def mark(self, busy: bool) -> None:
        self._ledger.write(self._slot, self._pid, self._cores, int(busy))

    def close(self) -> None:
        self._ledger.write(self._slot, 0, 0, 0)


def machine_idle() -> tuple[float, float]:
    """(idle, total) CPU seconds of the whole machine since boot, from /proc/stat ((0, 0) where it is missing)."""
    try:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:9]]
    except (OSError, ValueError):
        return 0.0, 0.0
    hz = os.sysconf("SC_CLK_TCK")
    return (fields[3] + fields[4]) / hz, sum(fields) / hz  # idle + iowait; user .. steal


class Borrower:
    """A learner's threads: ``own`` cores, plus the idle lenders' while they are idle (``resize``, between
    micro-batches), at most ``limit`` (default: the cores this process may run on), and never more than the
    machine had free over the last interval (its idle cores, plus what this process itself used past ``own``): a
    lent core that something else took is not used. ``set_threads`` is ``torch.set_num_threads``; it is called
    only when the count changes."""

    def __init__(
        self,
        path: Path,
        *,
        own: int,
        set_threads: Callable[[int], object],
        limit: int | None = None,
        free: Callable[[], float] | None = None,
    ) -> None:
        self._ledger, self.own, self._set = _Ledger(path), max(int(own), 1), set_threads
        self.limit = node_cores() if limit is None else limit
        self._free = self.free if free is None else free  # tests pass their own
        self.threads = 0
        self._last: tuple[float, float, float, float] | None = None  # wall, idle, total, own CPU seconds
        self.resize()

    def lendable(self) -> int:
        """Cores of the live lenders that are idle now (this process's own slot, if any, left out)."""
        total = 0
        for slot in range(SLOTS):
            pid, cores, busy = self._ledger.read(slot)
            if pid and pid != os.getpid() and not busy and _alive(pid):
                total += cores
        return total

    def free(self) -> float:
        """Cores this process could have used past ``own`` over the interval since the last call (inf at first)."""
        t = os.times()
        now = (time.monotonic(), *machine_idle(), t.user + t.system)
        last, self._last = self._last, now
        if last is None or now[2] <= last[2] or now[0] <= last[0]:
            return math.inf
        cpus = os.cpu_count() or 1  # /proc/stat sums every CPU of the machine
        idle = (now[1] - last[1]) / (now[2] - last[2]) * cpus  # idle cores on average
        mine = (now[3] - last[3]) / (now[0] - last[0])  # cores this process used on average
        return idle + max(mine - self.own, 0.0)

    def resize(self) -> int:
        """Size the threads to what is free now; returns the count."""
        free = self._free()
        n = min(self.own + self.lendable(), self.limit)
        if math.isfinite(free):
            n = min(n, self.own + int(free + 0.25))
        n = max(self.own, n)
        if n != self.threads:
            self._set(n)
            self.threads = n
        return n


def job_ledger(job: str | None, node: str | None) -> Path | None:
    """The ledger of Ray job ``job`` on node ``node`` (ids from Ray's runtime context; None for either, or
    without /dev/shm: no ledger). The node id is drawn anew at each Ray start, so a ledger never outlives its
    cluster's pids."""
    if not job or not node or not SHM.is_dir():
        return None
    return ledger_path(f"{job}-{node[:16]}")
