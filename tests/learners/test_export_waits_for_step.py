"""The object-store export (`Learner.get_weights`) waits for the optimiser step's queued kernels on a GPU
before it reads the weights, and does not touch CUDA on CPU. No GPU here: the stream is a recorder and the
learner a stand-in holding what `get_weights` reads."""

from __future__ import annotations

import contextlib
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from learners.learner import Learner


class _Packer:
    def __init__(self, calls: list[str]) -> None:
        self.calls = calls

    def pack(self, state: dict[str, torch.Tensor]) -> str:
        self.calls.append("pack")
        return "packed"


@pytest.mark.parametrize("device", ["cuda:0", "cpu"])
def test_get_weights_synchronises_before_the_pack_on_a_gpu(
    monkeypatch: pytest.MonkeyPatch, device: str
) -> None:
    calls: list[str] = []

    class Stream:
        def __init__(self, where: Any) -> None:
            self.where = where

        def synchronize(self) -> None:
            calls.append(f"synchronize {self.where}")

    monkeypatch.setattr(torch.cuda, "current_stream", lambda where=None: Stream(where))
    learner = SimpleNamespace(
        device=torch.device(device),
        rank=0,
        _full_params=contextlib.nullcontext,
        served=lambda: {"w": torch.zeros(2)},
        _packer=_Packer(calls),
    )
    assert Learner.get_weights(learner) == "packed"  # type: ignore[arg-type]
    assert calls == (["synchronize cuda:0", "pack"] if device != "cpu" else ["pack"])
