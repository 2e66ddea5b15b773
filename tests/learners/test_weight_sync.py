"""The object-store payload: one contiguous byte buffer, zero-copy views on the reader's side."""

from __future__ import annotations

import numpy as np
import torch

from exgrpo.transport.packed import ALIGN, PackedWeights, Packer, unpack_weights


def _state() -> dict[str, torch.Tensor]:
    emb = torch.randn(10, 4)
    return {
        "embed.weight": emb,
        "layer.0.w": torch.randn(4, 3).to(torch.bfloat16),
        "layer.0.b": torch.randn(3),
        "scalar": torch.tensor(2.5),
        "lm_head.weight": emb,  # tied to the embedding: stored once
    }


def test_pack_round_trips_every_dtype_and_stores_a_tied_tensor_once():
    state = _state()
    packed = Packer().pack(state)
    assert packed.buffer.dtype == np.uint8 and packed.buffer.ndim == 1
    assert [s.name for s in packed.layout] == list(state)
    slots = {s.name: s for s in packed.layout}
    assert slots["lm_head.weight"].offset == slots["embed.weight"].offset
    assert all(s.offset % ALIGN == 0 for s in packed.layout)
    distinct = 40 * 4 + 12 * 2 + 3 * 4 + 4
    assert distinct <= packed.buffer.size < distinct + 4 * ALIGN
    assert packed.numel == 40 + 12 + 3 + 1
    out = unpack_weights(packed)
    for name, t in state.items():
        assert out[name].dtype == t.dtype and out[name].shape == t.shape
        assert torch.equal(out[name], t), name  # bit-exact, bfloat16 too (raw bytes, no widening)


def test_views_share_the_buffer_and_the_buffer_is_reused_across_versions():
    packer, state = Packer(), _state()
    first = packer.pack(state)
    view = unpack_weights(first)["layer.0.b"]
    assert view.untyped_storage().data_ptr() == torch.from_numpy(first.buffer).untyped_storage().data_ptr()
    state["layer.0.b"].add_(1.0)
    second = packer.pack(state)
    assert second.buffer is not None and np.shares_memory(first.buffer, second.buffer)  # no new allocation
    assert torch.equal(unpack_weights(second)["layer.0.b"], state["layer.0.b"])
    state["extra"] = torch.ones(5)  # a new layout gets a new buffer
    third = packer.pack(state)
    assert not np.shares_memory(second.buffer, third.buffer)
    assert torch.equal(unpack_weights(third)["extra"], torch.ones(5))


def test_read_only_buffer_unpacks_without_copy():
    state = _state()
    packed = Packer().pack(state)
    ro = packed.buffer.copy()
    ro.flags.writeable = False  # what a zero-copy read from the Ray object store gives
    out = unpack_weights(PackedWeights(layout=packed.layout, buffer=ro))
    assert all(np.shares_memory(t.numpy(), ro) for t in out.values() if t.dtype != torch.bfloat16)
    assert all(torch.equal(out[k], v) for k, v in state.items())


def test_matrices_lie_back_to_back_so_fused_layers_view_them_as_one():
    """q/k/v (and gate/up) with their biases between them in the state dict: the matrices are stored in
    state order ahead of every 1-D tensor, so each fused group is one contiguous run of bytes."""
    state = {
        "q.weight": torch.randn(8, 16),
        "q.bias": torch.randn(8),
        "k.weight": torch.randn(4, 16),
        "k.bias": torch.randn(4),
        "v.weight": torch.randn(4, 16),
        "v.bias": torch.randn(4),
        "norm.weight": torch.randn(16),
    }
    slots = {s.name: s for s in Packer().pack(state).layout}
    assert [s for s in slots] == list(state)  # the table keeps the state dict's order
    assert slots["k.weight"].offset == slots["q.weight"].offset + slots["q.weight"].nbytes
    assert slots["v.weight"].offset == slots["k.weight"].offset + slots["k.weight"].nbytes
    assert min(slots[n].offset for n in state if n.endswith("bias")) >= slots["v.weight"].offset + 256
