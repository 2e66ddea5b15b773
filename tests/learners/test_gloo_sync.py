"""Weight transports: bucket plans by hand, numpy payloads, and a real 3-process gloo broadcast."""

from __future__ import annotations

import hashlib
import multiprocessing as mp

import numpy as np
import pytest
import torch

from learners.gloo_sync import (
    Bucket,
    CollectiveReceiver,
    CollectiveSender,
    ParamSpec,
    SyncGroupInfo,
    param_specs,
    plan_buckets,
    to_numpy_state,
)

torch.set_num_threads(1)


def _weights(seed: int) -> dict[str, torch.Tensor]:
    """Mixed dtypes and shapes, deterministic in ``seed``."""
    g = torch.Generator().manual_seed(seed)
    return {
        "embed.weight": torch.randn(64, 16, generator=g),  # 1024 float32 = 4 KiB
        "layer.0.w": torch.randn(16, 16, generator=g).to(torch.bfloat16),  # 256 bf16
        "layer.0.b": torch.randn(16, generator=g),
        "layer.1.w": torch.randn(16, 16, generator=g).to(torch.bfloat16),
        "scalar": torch.tensor(3.5),
        "lm_head.weight": torch.randn(64, 16, generator=g),
    }


def _digest(t: torch.Tensor) -> str:
    return hashlib.sha256(t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()).hexdigest()


def _receiver(info: SyncGroupInfo, rank: int, specs: list[ParamSpec], rounds: int, queue: mp.Queue) -> None:
    torch.set_num_threads(1)
    try:
        rx = CollectiveReceiver(info=info, rank=rank, specs=specs, timeout_s=60)
        rx.connect()
        for _ in range(rounds):
            got = rx.receive()
            queue.put(
                (
                    rank,
                    {k: (tuple(v.shape), str(v.dtype), _digest(v)) for k, v in got.items()},
                    rx.last_num_buckets,
                )
            )
    except Exception as e:  # reported to the parent, which fails the test
        queue.put((rank, f"{type(e).__name__}: {e}", -1))


def _start_receivers(info: SyncGroupInfo, specs: list[ParamSpec], rounds: int) -> tuple[list, mp.Queue]:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_receiver, args=(info, r, specs, rounds, queue)) for r in (1, 2)]
    for p in procs:
        p.start()
    return procs, queue


def test_plan_buckets_by_hand():
    specs = [
        ParamSpec("a", (4,), "float32"),  # 16 bytes
        ParamSpec("b", (2, 2), "bfloat16"),  # 8 bytes
        ParamSpec("c", (3,), "float32"),  # 12 bytes
        ParamSpec("d", (10,), "float32"),  # 40 bytes > bucket: alone
        ParamSpec("e", (), "float32"),  # 4 bytes
    ]
    # float32 in order a, c, d, e with 32-byte buckets: a+c = 28 <= 32; +d would be 68 -> close;
    # d alone (40 > 32, allowed as the only tensor); d+e = 44 > 32 -> e opens a new bucket. Then bf16: b.
    assert plan_buckets(specs, bucket_bytes=32) == [
        Bucket("float32", (0, 2), 7),
        Bucket("float32", (3,), 10),
        Bucket("float32", (4,), 1),
        Bucket("bfloat16", (1,), 4),
    ]
    assert plan_buckets(specs, bucket_bytes=1 << 20) == [
        Bucket("float32", (0, 2, 3, 4), 18),
        Bucket("bfloat16", (1,), 4),
    ]


def test_to_numpy_state_copies_and_widens_bfloat16():
    w = _weights(0)
    state = to_numpy_state(w)
    assert list(state) == list(w)
    assert state["layer.0.w"].dtype == np.float32  # numpy has no bfloat16: widened exactly
    np.testing.assert_array_equal(state["layer.0.w"], w["layer.0.w"].float().numpy())
    w["embed.weight"].add_(1.0)  # a snapshot: later changes to the live tensor do not show
    assert not np.array_equal(state["embed.weight"], w["embed.weight"].numpy())
    assert param_specs(w)[1] == ParamSpec("layer.0.w", (16, 16), "bfloat16")


def test_nccl_is_not_implemented_with_a_pointer():
    with pytest.raises(NotImplementedError, match="StatelessProcessGroup"):
        CollectiveSender(world_size=2, group_name="x", backend="nccl")


def test_broadcast_to_two_receivers_is_exact_and_bucketed():
    sent = [_weights(1), _weights(2)]
    specs = param_specs(sent[0])
    sender = CollectiveSender(
        world_size=3, group_name="test-sync", bucket_mb=2e-3, timeout_s=60
    )  # 2097 bytes
    procs, queue = _start_receivers(sender.info, specs, rounds=2)
    try:
        sender.connect()
        for w in sent:
            sender.send(w)
        # embed (4 KiB) and lm_head alone, layer.0.b + scalar together; both bf16 (512 B each) together.
        assert sender.last_num_buckets == 4
        results = [queue.get(timeout=60) for _ in range(4)]
    finally:
        for p in procs:
            p.join(timeout=30)
    expected = [{k: (tuple(v.shape), str(v.dtype), _digest(v)) for k, v in w.items()} for w in sent]
    by_rank: dict[int, list] = {1: [], 2: []}
    for rank, got, buckets in results:
        assert not isinstance(got, str), got
        assert buckets == 4
        by_rank[rank].append(got)
    assert by_rank[1] == expected and by_rank[2] == expected  # bit-exact, in order, both rounds
    assert all(p.exitcode == 0 for p in procs)
    sender.close()


def test_spec_mismatch_raises_on_every_rank():
    w = _weights(3)
    wrong = [ParamSpec(s.name, s.shape, "float64" if s.name == "scalar" else s.dtype) for s in param_specs(w)]
    sender = CollectiveSender(world_size=3, group_name="test-mismatch", timeout_s=60)
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [
        ctx.Process(target=_receiver, args=(sender.info, 1, param_specs(w), 1, queue)),
        ctx.Process(target=_receiver, args=(sender.info, 2, wrong, 1, queue)),
    ]
    for p in procs:
        p.start()
    try:
        sender.connect()
        with pytest.raises(RuntimeError, match="disagree on the parameter specs"):
            sender.send(w)
        outcomes = sorted(queue.get(timeout=60)[:2] for _ in range(2))
    finally:
        for p in procs:
            p.join(timeout=30)
    assert [r for r, _ in outcomes] == [1, 2]
    assert all(isinstance(msg, str) and "disagree" in msg for _, msg in outcomes)
