"""The update engine: what the pure update (`learners/update.py::update`) needs from the model it trains,
as one Protocol (`UpdateEngine`), and its two implementations.

    UpdateEngine  the forward module and its device, the micro-batches of a mini-batch's rows, the
                  accumulation boundary, backward, the optimiser step, the sum over ranks, the KL reference
    RankEngine    a DeepSpeed rank's (`learners/learner.py::Learner.update`): the engine's backward and
                  step, its accumulation boundary, torch.distributed's all-reduce
    ModelEngine   a bare torch model on one process: `objective.backward()`, the caller's step (unit tests
                  of the update, a notebook)

Log-probs and entropies come from `learners.logits` over `module` (`response_stats`, `per_token`),
`chunk_tokens` response positions per lm_head chunk, so every engine computes them the same way.
Nothing here imports Ray, DeepSpeed or vLLM.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

import torch
from torch import Tensor

from exgrpo.core.config import LearnerConfig
from learners import batches
from learners.batches import Encoded, Row


class UpdateEngine(Protocol):
    """The model calls of one update (`learners.update.update`)."""

    module: Any  # what the forward runs: a torch.nn.Module whose output has `.logits` (or a DeepSpeed engine)
    device: torch.device  # where the batch's tensors go
    world_size: int  # ranks whose gradients `backward` averages (1: one process)
    chunk_tokens: int | None  # response positions per lm_head + log-softmax chunk (None: the full logits)
    has_reference: bool  # whether `reference_logprobs` exists (exactly when `loss.kl_coef` > 0)
    pack: bool  # rows sharing a prompt run as one sequence (`learners.batches.packed`)

    def micro_batches(self, rows: Sequence[Row]) -> list[slice]:
        """The micro-batches (gradient accumulation) of a mini-batch's rows; also the slices of the no-grad
        proximal pass. Under ZeRO-3 every rank must return as many."""

    def boundary(self, last: bool) -> None:
        """Before each micro-batch's forward: whether it is the mini-batch's last (the accumulation boundary)."""

    def backward(self, objective: Tensor) -> None:
        """Accumulate the gradient of a micro-batch's weighted objective (averaged over ranks)."""

    def step(self) -> tuple[float, bool]:
        """One optimiser step on the accumulated gradient: (grad norm, skipped)."""

    def all_reduce(self, tensor: Tensor) -> None:
        """Sum `tensor` over the ranks in place (nothing at world size 1)."""

    def reference_logprobs(self, enc: Encoded) -> Tensor:
        """(n, R) no-grad log-probs of the reference policy (the KL penalty), when `has_reference`."""


class RankEngine:
    """`UpdateEngine` of one DeepSpeed rank: `engine` is the DeepSpeed engine (also the forward module),
    `optimizer` its client `GuardedAdamW`, `cfg` the rank's `LearnerConfig` (micro-batches: `batches.micro_slices`;
    under ZeRO-3 with several ranks padded with empty slices to the most over ranks, since every rank must run
    as many forwards); `reference` the reference policy's log-probs, or None."""

    def __init__(
        self,
        engine: Any,
        optimizer: Any,
        *,
        cfg: LearnerConfig,
        device: torch.device,
        world_size: int,
        reference: Callable[[Encoded], Tensor] | None = None,
        pack: bool = False,
        resize: Callable[[], object] | None = None,
    ) -> None:
        self.module, self.optimizer, self.device, self.world_size = engine, optimizer, device, world_size
        self.pack, self._resize = pack, resize
        self.cfg, self._reference = cfg, reference
        self.chunk_tokens: int | None = cfg.logits_chunk_tokens
        self.has_reference = reference is not None

    def micro_batches(self, rows: Sequence[Row]) -> list[slice]:
        slices = batches.micro_slices(
            rows, size=self.cfg.micro_batch_size, max_tokens=self.cfg.max_tokens_per_micro_batch
        )
        if self.cfg.zero_stage == 3 and self.world_size > 1:  # ZeRO-3's forward all-gathers parameters
            import torch.distributed as dist

            count = torch.tensor(len(slices), device=self.device)
            dist.all_reduce(count, op=dist.ReduceOp.MAX)
            slices += [slice(0, 0)] * (int(count) - len(slices))
        return slices

    def boundary(self, last: bool) -> None:
        if self._resize is not None:  # the threads, to the cores free now (`exgrpo.core.cores.Borrower`)
            self._resize()
        self.module.set_gradient_accumulation_boundary(last)

    def backward(self, objective: Tensor) -> None:
        self.module.backward(objective, scale_wrt_gas=False)

    def step(self) -> tuple[float, bool]:
        """One engine step (the accumulation boundary): (grad norm, skipped) from `GuardedAdamW`."""
        self.optimizer.begin()
        self.module.step()
        return self.optimizer.last_grad_norm, self.optimizer.overflow

    def all_reduce(self, tensor: Tensor) -> None:
        if self.world_size > 1:
            import torch.distributed as dist

            dist.all_reduce(tensor)

    def reference_logprobs(self, enc: Encoded) -> Tensor:
        if self._reference is None:
            raise ValueError("this engine has no reference policy (loss.kl_coef = 0)")
        return self._reference(enc)


class ModelEngine:
    """`UpdateEngine` of a bare torch model on one process: micro-batches of `micro_batch_size` rows (or at
    most `max_tokens_per_micro_batch` padded tokens: `batches.micro_slices`, as a rank's), `objective.backward()`,
    and `step()` (default: no optimiser step, the gradient kept: (0.0, False))."""

    world_size = 1

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        micro_batch_size: int,
        max_tokens_per_micro_batch: int | None = None,
        step: Callable[[], tuple[float, bool]] | None = None,
        chunk_tokens: int | None = None,
        reference: Callable[[Encoded], Tensor] | None = None,
        device: torch.device | None = None,
        pack: bool = False,
    ) -> None:
        self.module, self.device, self.pack = model, device or torch.device("cpu"), pack
        self.micro_batch_size, self.max_tokens = micro_batch_size, max_tokens_per_micro_batch
        self.chunk_tokens, self._step, self._reference = chunk_tokens, step, reference
        self.has_reference = reference is not None

    def micro_batches(self, rows: Sequence[Row]) -> list[slice]:
        return batches.micro_slices(rows, size=self.micro_batch_size, max_tokens=self.max_tokens)

    def boundary(self, last: bool) -> None:
        pass

    def backward(self, objective: Tensor) -> None:
        objective.backward()

    def step(self) -> tuple[float, bool]:
        return self._step() if self._step is not None else (0.0, False)

    def all_reduce(self, tensor: Tensor) -> None:
        pass

    def reference_logprobs(self, enc: Encoded) -> Tensor:
        if self._reference is None:
            raise ValueError("this engine has no reference policy (loss.kl_coef = 0)")
        return self._reference(enc)
