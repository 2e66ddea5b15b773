"""The gloo weight-transfer wire (`exgrpo/transport/gloo.py`): chunks through reused buffers, two versions.

A real two-rank gloo world in one process (a thread per rank); the receiving engine's model is a small
recorder standing in for vLLM's worker model (its `load_weights` keeps copies of what it is given).
"""

from __future__ import annotations

import threading

import pytest
import torch

pytest.importorskip("vllm")

from vllm.distributed.weight_transfer.base import ParamMeta  # noqa: E402

from exgrpo.transport.gloo import (  # noqa: E402
    GlooTrainerWeightTransferEngine,
    GlooUpdateInfo,
    GlooWeightTransferEngine,
    _gloo_group,
    chunk_plan,
)


class Recorder(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.loaded: dict[str, torch.Tensor] = {}
        self.pointers: set[int] = set()

    def load_weights(self, weights) -> None:
        for name, t in weights:
            self.loaded[name] = t.clone()
            self.pointers.add(t.untyped_storage().data_ptr())


def _state(seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {
        "a.weight": torch.randn(6, 5, generator=gen),
        "a.bias": torch.randn(6, generator=gen),
        "b.weight": torch.randn(3, 8, generator=gen).to(torch.bfloat16),
        "c.weight": torch.randn(40, generator=gen),
        "d.weight": torch.randn(2, 2, generator=gen),
    }


@pytest.mark.vllm
def test_every_chunk_arrives_intact_through_buffers_reused_across_versions() -> None:
    store = torch.distributed.HashStore()
    groups: list = [None, None]

    def join(rank: int) -> None:
        groups[rank] = _gloo_group(store, name="w", rank=rank, world_size=2, timeout_s=30)

    joins = [threading.Thread(target=join, args=(r,)) for r in (0, 1)]
    for t in joins:
        t.start()
    for t in joins:
        t.join()
    sender = GlooTrainerWeightTransferEngine(client=None, source=None, is_sender=True, buffer_size_bytes=100)
    sender._group = groups[0]
    receiver = GlooWeightTransferEngine.__new__(GlooWeightTransferEngine)  # no vLLM worker behind it
    receiver.model, receiver.device = Recorder(), torch.device("cpu")
    receiver._group, receiver._buffer_bytes, receiver._received = groups[1], 100, None
    staging, received = [], []
    for version in (1, 2):
        state = _state(version)
        meta = [ParamMeta(n, t.dtype, tuple(t.shape)) for n, t in state.items()]
        assert len(chunk_plan([(m.name, m.shape, m.dtype) for m in meta], 100)) >= 3  # several chunks
        update = GlooUpdateInfo(
            names=[m.name for m in meta],
            dtype_names=[str(m.dtype).removeprefix("torch.") for m in meta],
            shapes=[list(m.shape) for m in meta],
        )
        recv = threading.Thread(target=receiver.receive_weights, args=(update,))
        recv.start()
        sender._send(iter(state.items()), meta)
        recv.join(timeout=30)
        assert not recv.is_alive()
        assert receiver.model.loaded.keys() == state.keys()
        for name, t in state.items():
            assert torch.equal(receiver.model.loaded[name], t), (version, name)
        staging.append(sender._staging.data_ptr())
        received.append(receiver._received.data_ptr())
    assert staging[0] == staging[1] and received[0] == received[1]  # no buffer allocated for version 2
    assert receiver.model.pointers == {received[0]}  # every chunk was a slice of the one receive buffer


@pytest.mark.vllm
def test_a_source_longer_than_its_metadata_fails() -> None:
    sender = GlooTrainerWeightTransferEngine(
        client=None, source=None, is_sender=True, buffer_size_bytes=1 << 20
    )
    sender._group = _gloo_group(torch.distributed.HashStore(), name="solo", rank=0, world_size=1, timeout_s=5)
    state = _state(0)
    meta = [ParamMeta(n, t.dtype, tuple(t.shape)) for n, t in list(state.items())[:2]]
    with pytest.raises(ValueError, match="more tensors"):
        sender._send(iter(state.items()), meta)
