"""What a learner trains and what it serves, full fine-tuning or LoRA, behind one small interface.

`TrainedWeights` is what the Learner asks of its weights: the model it trains (`wrap`), the HF-named state the
samplers serve and its checksum, the parameters the optimiser holds, the frozen initial weights a checkpoint
must find again, what a checkpoint writes and checks, and the module vLLM's weight-transfer source reads.
`FullWeights` trains and serves every parameter; `LoraWeights` (`learners/lora.py`) trains the adapters and
serves the merged W + s B A under the base's names. `trained_weights(cfg)` picks one from
`learners.lora_rank`; the Learner never branches on it. Tests: tests/learners/test_lora_kl.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

import torch
from torch import Tensor

from exgrpo.core.config import LearnerConfig
from learners import lora
from learners.reference import checksum


class TrainedWeights(Protocol):
    lora: (
        bool  # the initial policy stays inside the model (the adapters off), so a KL reference needs no copy
    )
    partial_checkpoint: bool  # the DeepSpeed checkpoint holds the trained parameters only

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        """The model the optimiser trains."""

    def served(self, module: torch.nn.Module) -> dict[str, Tensor]:
        """The HF-named state dict the samplers serve."""

    def served_checksum(self, module: torch.nn.Module) -> float:
        """float64 sum of every served parameter (full parameters inside a ZeRO-3 gather)."""

    def trainable(self, module: torch.nn.Module, *, total: int) -> int:
        """Parameters the optimiser updates (`total`: the full model's)."""

    def push_source(self, module: torch.nn.Module) -> Any:
        """What vLLM's weight-transfer source reads (`named_parameters()`), current as of this call."""

    def frozen_initial(self, module: torch.nn.Module) -> dict[str, Tensor] | None:
        """The initial policy's tensors that stay frozen in the model (None: none do)."""

    def save(self, module: torch.nn.Module, out: Path) -> None:
        """Rank 0's HF files in `out` (the served weights, and what else a user loads)."""

    def client_state(self, module: torch.nn.Module) -> dict[str, Any]:
        """What the DeepSpeed checkpoint records of these weights, checked by `check_loaded`."""

    def check_loaded(self, module: torch.nn.Module, client: dict[str, Any], *, path: str) -> None:
        """Raise ValueError when the checkpoint at `path` does not hold these weights."""


class FullWeights:
    """Every parameter trains; the samplers serve the module's own state dict."""

    lora = False
    partial_checkpoint = False

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        return model

    def served(self, module: torch.nn.Module) -> dict[str, Tensor]:
        return module.state_dict()

    def served_checksum(self, module: torch.nn.Module) -> float:
        return float(sum(p.detach().double().sum() for p in module.parameters()))

    def trainable(self, module: torch.nn.Module, *, total: int) -> int:
        return total

    def push_source(self, module: torch.nn.Module) -> Any:
        return module

    def frozen_initial(self, module: torch.nn.Module) -> dict[str, Tensor] | None:
        return None

    def save(self, module: torch.nn.Module, out: Path) -> None:
        module.save_pretrained(out, state_dict=self.served(module))

    def client_state(self, module: torch.nn.Module) -> dict[str, Any]:
        return {}

    def check_loaded(self, module: torch.nn.Module, client: dict[str, Any], *, path: str) -> None:
        return None


class LoraWeights:
    """The adapters train (`learners.lora_rank` = r); the samplers serve the merged weights, every tensor."""

    lora = True
    partial_checkpoint = True

    def __init__(self, cfg: LearnerConfig) -> None:
        self.cfg = cfg
        self._view: lora.MergedView | None = (
            None  # the merged buffers vLLM's source reads, built at first push
        )

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        return lora.wrap(model, self.cfg)

    def served(self, module: torch.nn.Module) -> dict[str, Tensor]:
        return lora.merged_state(module)

    def served_checksum(self, module: torch.nn.Module) -> float:
        return checksum(lora.merged_parameters(module))

    def trainable(self, module: torch.nn.Module, *, total: int) -> int:
        return lora.trainable_count(module)

    def push_source(self, module: torch.nn.Module) -> Any:
        if self._view is None:
            self._view = lora.MergedView(module)
        self._view.refresh()
        return self._view

    def frozen_initial(self, module: torch.nn.Module) -> dict[str, Tensor] | None:
        return lora.base_parameters(module)

    def save(self, module: torch.nn.Module, out: Path) -> None:
        """The merged model under the base's names, and the adapter alone in `out/adapter` for PEFT."""
        module.get_base_model().save_pretrained(out, state_dict=self.served(module))
        module.save_pretrained(out / "adapter")

    def client_state(self, module: torch.nn.Module) -> dict[str, Any]:
        return {"adapters": checksum(_adapters(module))}

    def check_loaded(self, module: torch.nn.Module, client: dict[str, Any], *, path: str) -> None:
        if client.get("adapters") != checksum(_adapters(module)):
            raise ValueError(f"{path} holds no adapters of learners.lora_rank={self.cfg.lora_rank}")


def trained_weights(cfg: LearnerConfig) -> FullWeights | LoraWeights:
    """LoRA with `learners.lora_rank` > 0, else full fine-tuning."""
    return LoraWeights(cfg) if cfg.lora_rank > 0 else FullWeights()


def _adapters(module: torch.nn.Module) -> dict[str, Tensor]:
    return {n: p for n, p in module.named_parameters() if p.requires_grad}
