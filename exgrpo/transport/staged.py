"""Weights staged in a file, for a vLLM engine core that runs in its own process (pure: torch, no Ray).

In that layout (`samplers.engine_process=child`, vLLM's default on GPUs) a `collective_rpc` argument crosses
a msgpack boundary and is pickled again for the worker, and in-memory tensors fail on the way ("cannot pickle
memoryview objects"). So the sampler writes the state dict once into a file (the packed layout of
`exgrpo.transport.packed`) and sends the worker only a path and the layout (plain strings and ints); the worker
maps the file (`map_staged`) and loads from views of it.

A `Stager` (one per engine) keeps one file for all its loads, on /dev/shm when it has room, else the temp
directory. Its space is reserved with `posix_fallocate` before it is mapped, so a full directory is an OSError
there (and the next directory is tried, with a log line), never a SIGBUS mid-write (the sampler writes it with
`pwrite`, without mapping it); it grows when a state dict needs more. The file is unlinked as soon as it is created and the worker opens it as
/proc/<sampler pid>/fd/<fd>: it lives as long as the sampler (and a mapping of it) does, even one killed
mid-load. Named files of samplers whose process is gone (an earlier version's, or one killed between creating
and unlinking its file) are swept when a stager starts.
"""

from __future__ import annotations

import errno
import logging
import mmap
import os
import re
import shutil
import tempfile
import threading
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from exgrpo.transport.packed import TensorSlot, plan_layout

SHM = Path("/dev/shm")
HEADROOM = (
    1.1  # a directory must have this many times the bytes it is asked for free (room for its other users)
)
PREFIX = "exgrpo-stage"
# a staging file's name carries its sampler's pid; "exgrpo-weights-" is the name of the per-load files of before
_NAMED = re.compile(r"exgrpo-(?:stage|weights)-(\d+)-[0-9a-f]+\.bin")
FIX = (
    "enlarge /dev/shm (e.g. docker --shm-size, a KubeRay emptyDir with medium Memory) or set TMPDIR to a "
    "larger directory"
)

log = logging.getLogger(__name__)

# (name, dtype name, shape, byte offset, bytes): a `TensorSlot` as plain values (msgpack carries them)
Slot = tuple[str, str, list[int], int, int]


@dataclass(frozen=True)
class Staged:
    """A state dict written to the file at `path`; `layout` says where each tensor lies in it."""

    path: str
    layout: list[Slot]
    nbytes: int


def staging_dirs() -> tuple[Path, ...]:
    """Where a stager looks, in order: /dev/shm (memory, no disk write), then the temp directory (TMPDIR)."""
    return (SHM, Path(tempfile.gettempdir()))


class Stager:
    """One engine's staging file, reused from load to load (see the module doc).

    `stage` is a context manager: the worker loads inside the block, and the next `stage` waits for it. With
    `keep=False` the file is given back after each load (its space returns once the worker's mapping is gone):
    for an engine whose loads are rare (a catch-up beside a collective weight transport), so it does not hold
    the model's size of /dev/shm between them. A file is never shrunk, so a mapping of it never faults."""

    def __init__(self, candidates: Sequence[Path] | None = None, *, keep: bool = True) -> None:
        self.candidates = tuple(candidates) if candidates is not None else staging_dirs()
        self.keep = keep
        self.directory: Path | None = None  # where the file is
        self.reserved = 0  # bytes reserved in it
        self._fd: int | None = None
        self._lock = threading.Lock()
        for where in self.candidates:
            sweep(where)

    @property
    def path(self) -> str | None:
        """The file as another process of this machine opens it (it has no name of its own)."""
        return None if self._fd is None else f"/proc/{os.getpid()}/fd/{self._fd}"

    @contextmanager
    def stage(self, weights: Mapping[str, torch.Tensor]) -> Iterator[Staged]:
        """Write `weights` (a tied tensor once) into the file, reserving more room first if they need it."""
        layout, total = plan_layout(weights)
        with self._lock:
            self._reserve(max(total, 1))
            assert self._fd is not None and self.path is not None
            _write(self._fd, layout, weights)
            slots = [(s.name, s.dtype, list(s.shape), s.offset, s.nbytes) for s in layout]
            try:
                yield Staged(path=self.path, layout=slots, nbytes=total)
            finally:
                if not self.keep:
                    self._drop()

    def close(self) -> None:
        """Give the file back now (it also goes when this process ends)."""
        with self._lock:
            self._drop()

    def _drop(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
        self._fd, self.directory, self.reserved = None, None, 0

    def _reserve(self, nbytes: int) -> None:
        if self._fd is not None and nbytes <= self.reserved:
            return
        reasons = []
        for where in self.candidates:
            try:
                self._reserve_in(where, nbytes)
            except OSError as err:
                reasons.append(f"{where}: {err.strerror or err}")
                continue
            if reasons:
                log.warning(
                    "staging %.0f MiB of weights in %s instead (%s)",
                    nbytes / 2**20,
                    where,
                    "; ".join(reasons),
                )
            return
        raise OSError(
            errno.ENOSPC,
            f"no room to stage {nbytes / 2**20:.0f} MiB of weights for the vLLM engine core "
            f"({'; '.join(reasons)}): {FIX}",
        )

    def _reserve_in(self, where: Path, nbytes: int) -> None:
        """Reserve `nbytes` in a file in `where` (this stager's file when it is there, else a new one), or raise
        OSError with nothing reserved there."""
        grow = self._fd is not None and where == self.directory
        need = nbytes - (self.reserved if grow else 0)
        if not where.is_dir():
            raise OSError(errno.ENOENT, "not a directory")
        free, asked = shutil.disk_usage(where).free, need + (HEADROOM - 1) * nbytes
        if free < asked:
            raise OSError(errno.ENOSPC, f"{free / 2**20:.0f} MiB free, {asked / 2**20:.0f} MiB asked")
        if grow:
            assert self._fd is not None
            try:
                os.posix_fallocate(self._fd, 0, nbytes)
            except OSError:
                self._drop()  # too small for this state dict: its room goes back before the next directory
                raise
            self.reserved = nbytes
            return
        path = where / f"{PREFIX}-{os.getpid()}-{uuid.uuid4().hex[:12]}.bin"
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        # nameless from here on: nothing is left behind, whatever ends this process
        path.unlink(missing_ok=True)
        try:
            os.posix_fallocate(fd, 0, nbytes)
        except BaseException:
            os.close(fd)
            raise
        self._drop()
        self._fd, self.directory, self.reserved = fd, where, nbytes


def sweep(where: Path) -> int:
    """Remove the named staging files in `where` whose sampler's process is gone; returns how many."""
    gone = 0
    try:
        names = os.listdir(where)
    except OSError:
        return 0
    for name in names:
        match = _NAMED.fullmatch(name)
        if match is None or _alive(int(match.group(1))):
            continue
        try:
            size = os.stat(where / name).st_size
            os.unlink(where / name)
        except OSError:
            continue  # another stager swept it first, or not ours to remove
        gone += 1
        log.warning(
            "removed %s (%.0f MiB), the staging file of a sampler that is gone", where / name, size / 2**20
        )
    return gone


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's
    return True


def _write(fd: int, layout: list[TensorSlot], weights: Mapping[str, torch.Tensor]) -> None:
    """Each distinct tensor's bytes at its slot, by `pwrite`: the sampler never maps the file (a write error is
    an OSError, not a fault; its RSS does not grow by the file's size), and it ran faster than a copy into a
    fresh shared mapping here."""
    written: set[int] = set()
    for slot, t in zip(layout, weights.values(), strict=True):
        if slot.offset in written or slot.nbytes == 0:
            continue
        data = memoryview(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy())
        done = 0
        while done < slot.nbytes:  # one write moves at most ~2 GiB
            done += os.pwrite(fd, data[done:], slot.offset + done)
        written.add(slot.offset)


def map_staged(path: str, layout: list[Slot]) -> list[tuple[str, torch.Tensor]]:
    """(name, tensor) views of a staged file, in layout order (a private copy-on-write mapping: the loader may
    write to a view without touching the file; the mapping lives as long as a view of it)."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        mm = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY)
    flat = torch.from_numpy(np.frombuffer(mm, dtype=np.uint8))
    out = []
    for name, dtype, shape, offset, nbytes in layout:
        out.append((name, flat[offset : offset + nbytes].view(getattr(torch, dtype)).view(tuple(shape))))
    return out
