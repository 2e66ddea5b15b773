"""Packed weights: a model's tensors as one contiguous, 64-byte-aligned byte buffer plus a table of slots (pure).

`Packer` writes the learner's tensors into a reused buffer (raw bytes of every dtype, bfloat16 included; a
tied tensor once); `unpack_weights` gives a sampler views of the same bytes, zero-copy. The object-store
transport (`broadcast.py`) moves one `PackedWeights` per version; nothing here imports Ray.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

ALIGN = 64  # byte alignment of every tensor in the packed buffer (any dtype can view its slice)


# ------------------------------------------------------------------------------------- one contiguous buffer
@dataclass(frozen=True)
class TensorSlot:
    """Where one state-dict entry lives in a packed buffer (tied entries share an offset)."""

    name: str
    dtype: str  # torch dtype name without "torch."
    shape: tuple[int, ...]
    offset: int  # in bytes, a multiple of ALIGN
    nbytes: int


@dataclass(frozen=True)
class PackedWeights:
    """A state dict as one contiguous byte buffer plus its layout (what rank 0 puts in the object store).

    Ray serialises the buffer out of band: one copy into the object store, and every reader maps it
    zero-copy (read-only) without unpickling a tensor."""

    layout: tuple[TensorSlot, ...]
    buffer: np.ndarray  # uint8, 1-D

    @property
    def numel(self) -> int:
        """Elements of the distinct tensors (a tied tensor counts once)."""
        seen = {s.offset: int(np.prod(s.shape, dtype=np.int64)) for s in self.layout}
        return sum(seen.values())


class Packer:
    """Packs a state dict into a byte buffer it allocates once and reuses for every version.

    Reuse is safe because an actor method's return value is copied into the object store before the
    actor runs its next call."""

    def __init__(self) -> None:
        self._buffer: torch.Tensor | None = None
        self._layout: tuple[TensorSlot, ...] = ()

    def pack(self, state: Mapping[str, torch.Tensor]) -> PackedWeights:
        """The state dict's bytes; slots keep its order, and the matrices come first in the buffer, in
        that order, so the parts of a fused layer (q/k/v, gate/up) lie back to back, with no bias between
        them, whenever their sizes are multiples of ALIGN (a vLLM sampler then views them as one matrix)."""
        layout, total = plan_layout(state)
        if self._buffer is None or self._buffer.numel() != total or tuple(layout) != self._layout:
            self._buffer = torch.empty(total, dtype=torch.uint8)
            self._layout = tuple(layout)
        written: set[int] = set()
        with torch.no_grad():
            for slot, t in zip(layout, state.values(), strict=True):
                if slot.offset not in written:
                    _view(self._buffer, slot).copy_(t.detach())
                    written.add(slot.offset)
        return PackedWeights(layout=self._layout, buffer=self._buffer.numpy())


def plan_layout(state: Mapping[str, torch.Tensor]) -> tuple[list[TensorSlot], int]:
    """Each entry's slot in a packed buffer and the buffer's size: matrices first, in state-dict order (the
    parts of a fused layer lie back to back), then the rest; a tied tensor once, every slot ALIGN-aligned."""
    offsets: dict[tuple[int, torch.dtype, tuple[int, ...]], int] = {}
    total = 0
    for matrices in (True, False):
        for t in state.values():
            key = (t.data_ptr(), t.dtype, tuple(t.shape))
            if (t.dim() >= 2) == matrices and key not in offsets:  # a tied tensor is stored once
                offsets[key] = total
                total += -(-t.numel() * t.element_size() // ALIGN) * ALIGN
    layout = [
        TensorSlot(
            name,
            str(t.dtype).removeprefix("torch."),
            tuple(t.shape),
            offsets[(t.data_ptr(), t.dtype, tuple(t.shape))],
            t.numel() * t.element_size(),
        )
        for name, t in state.items()
    ]
    return layout, total


def chunk_cuts(sizes: Sequence[int], buffer_bytes: int) -> list[list[int]]:
    """vLLM's cut of a stream of tensors (`sizes` in bytes, in order) into chunks (its `pack_tensors`): indices in
    order, a chunk closes once it exceeds `buffer_bytes`. Both sides of a chunked broadcast cut the same way."""
    chunks: list[list[int]] = [[]]
    size = 0
    for i, nbytes in enumerate(sizes):
        chunks[-1].append(i)
        size += nbytes
        if size > buffer_bytes:
            chunks.append([])
            size = 0
    return [c for c in chunks if c]


def _view(buffer: torch.Tensor, slot: TensorSlot) -> torch.Tensor:
    dtype = getattr(torch, slot.dtype)
    return buffer[slot.offset : slot.offset + slot.nbytes].view(dtype).view(slot.shape)


def unpack_weights(packed: PackedWeights) -> dict[str, torch.Tensor]:
    """name -> tensor views of the packed buffer (no copy; read-only when it came from the object store)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given buffer is not writable")
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        flat = torch.from_numpy(packed.buffer) if packed.buffer.size else torch.empty(0, dtype=torch.uint8)
    return {slot.name: _view(flat, slot) for slot in packed.layout}
