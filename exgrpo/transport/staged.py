"""Weights staged in a file, for a vLLM engine core that runs in its own process (pure: torch, no Ray).

In that layout (`samplers.engine_process=child`, vLLM's default on GPUs) a `collective_rpc` argument crosses
a msgpack boundary and is pickled again for the worker, and in-memory tensors fail on the way ("cannot pickle
memoryview objects"). So the sampler writes the state dict once into a file (`stage_weights`: the packed
layout of `exgrpo.transport.packed`, on /dev/shm when it has room) and sends the worker only the path and
the layout (plain strings and ints); the worker maps the file (`map_staged`) and loads from views of it.
"""

from __future__ import annotations

import mmap
import os
import shutil
import tempfile
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from exgrpo.transport.packed import TensorSlot, plan_layout

SHM = Path("/dev/shm")
HEADROOM = 1.1  # a staging directory must have this many times the weights' bytes free

# (name, dtype name, shape, byte offset, bytes): a `TensorSlot` as plain values (msgpack carries them)
Slot = tuple[str, str, list[int], int, int]


@dataclass(frozen=True)
class Staged:
    """A state dict written to `path`; `layout` says where each tensor lies in it."""

    path: str
    layout: list[Slot]
    nbytes: int

    def remove(self) -> None:
        Path(self.path).unlink(missing_ok=True)


def stage_dir(nbytes: int, *, candidates: tuple[Path, ...] | None = None) -> Path:
    """Where to stage `nbytes`: /dev/shm (memory, no disk write) when it has room, else the temp directory."""
    for where in candidates or (SHM, Path(tempfile.gettempdir())):
        if (
            where.is_dir()
            and os.access(where, os.W_OK)
            and shutil.disk_usage(where).free >= nbytes * HEADROOM
        ):
            return where
    raise OSError(
        f"no room to stage {nbytes / 2**20:.0f} MiB of weights for the vLLM engine core (tried "
        f"{', '.join(str(p) for p in candidates or (SHM, Path(tempfile.gettempdir())))}): enlarge /dev/shm "
        "(e.g. docker --shm-size, a KubeRay emptyDir with medium Memory) or set TMPDIR to a larger directory"
    )


def stage_weights(weights: Mapping[str, torch.Tensor], *, directory: Path | None = None) -> Staged:
    """Write `weights` once (a tied tensor once) into a new file and return where each lies."""
    layout, total = plan_layout(weights)
    where = directory if directory is not None else stage_dir(total)
    path = where / f"exgrpo-weights-{os.getpid()}-{uuid.uuid4().hex[:12]}.bin"
    try:
        with open(path, "wb+") as f:
            f.truncate(max(total, 1))
            with mmap.mmap(f.fileno(), max(total, 1)) as mm:
                _write(mm, layout, weights)  # its views are gone when it returns: the map can close
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    slots = [(s.name, s.dtype, list(s.shape), s.offset, s.nbytes) for s in layout]
    return Staged(path=str(path), layout=slots, nbytes=total)


def _write(mm: mmap.mmap, layout: list[TensorSlot], weights: Mapping[str, torch.Tensor]) -> None:
    flat = torch.frombuffer(mm, dtype=torch.uint8)
    written: set[int] = set()
    with torch.no_grad():
        for slot, t in zip(layout, weights.values(), strict=True):
            if slot.offset not in written:
                target = flat[slot.offset : slot.offset + slot.nbytes].view(getattr(torch, slot.dtype))
                target.view(slot.shape).copy_(t.detach())
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
