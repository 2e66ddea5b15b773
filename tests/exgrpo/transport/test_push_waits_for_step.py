"""The collective push waits for the optimiser step (`WeightPusher.wait_for_step`) before vLLM's producer,
which packs on CUDA streams of its own, reads the weights. No GPU here: the CUDA stream is a recorder; the
device check's `stream` part (bench/learner/device_stream.py) shows the race on a GPU."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch

pytestmark = pytest.mark.vllm


class _Stream:
    def __init__(self, calls: list[str], device: Any) -> None:
        self.calls, self.device = calls, device

    def synchronize(self) -> None:
        self.calls.append(f"synchronize {self.device}")


def _cuda_streams(monkeypatch: pytest.MonkeyPatch, calls: list[str]) -> None:
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: _Stream(calls, device))


class _GpuModule:
    """Parameters that say they live on cuda:0 (a CPU build cannot make such tensors)."""

    def named_parameters(self) -> Any:
        yield "w", SimpleNamespace(device=torch.device("cuda", 0))


def test_wait_for_step_synchronises_the_current_stream_on_a_gpu_only(monkeypatch: pytest.MonkeyPatch) -> None:
    from exgrpo.transport.vllm_api import WeightPusher

    calls: list[str] = []
    _cuda_streams(monkeypatch, calls)
    WeightPusher.wait_for_step(torch.nn.Linear(2, 2))  # CPU weights: nothing to wait for
    assert calls == []
    WeightPusher.wait_for_step(_GpuModule())
    assert calls == ["synchronize cuda:0"]  # once, on the weights' device


class _Engine:
    """A trainer engine whose send records when it ran (vLLM's producer would read the weights there)."""

    def __init__(self, calls: list[str]) -> None:
        self.calls = calls
        self.client = SimpleNamespace(tag=lambda version: calls.append(f"tag {version}"), apply_s=[0.1])

    def send_weights(self) -> None:
        self.calls.append("send")


@pytest.mark.parametrize("sender", [True, False], ids=["rank0", "zero3-rank"])
def test_every_rank_waits_for_the_step_before_the_send(monkeypatch: pytest.MonkeyPatch, sender: bool) -> None:
    from exgrpo.transport.gloo import GLOO
    from exgrpo.transport.vllm_api import WeightPusher, _world

    calls: list[str] = []
    pusher = WeightPusher(module=torch.nn.Linear(2, 2), backend=GLOO, host="127.0.0.1", is_sender=sender)
    monkeypatch.setattr(pusher, "wait_for_step", lambda module: calls.append(f"wait {type(module).__name__}"))
    members = {"sampler-0": object()} if sender else None
    pusher._engine = _Engine(calls)  # a world already open with these members: no rebuild
    pusher._world = _world(members) if members else ()
    pusher.push(version=3, members=members)
    assert calls == ["wait Linear", "tag 3", "send"] if sender else ["wait Linear", "send"]
