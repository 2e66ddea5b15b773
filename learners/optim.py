"""The learner's optimiser (AdamW with the global grad-norm rule of docs/architecture.md, "The algorithm") and DeepSpeed config.

DeepSpeed's ``gradient_clipping`` is off; the client optimiser's ``step`` sees the final, rank-averaged,
unscaled fp32 gradients (the whole model under ZeRO-0, this rank's partition under ZeRO 1-3, where the
squared sums are all-reduced), skips the step when the global norm is non-finite or above
``skip_grad_norm``, else clips to ``grad_clip`` and steps.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from exgrpo.core.config import LearnerConfig

NORM_CHUNK = 1 << 24  # elements per float32 chunk of the squared sum (64 MiB of float32)


def squared_sum(grad: Tensor, chunk: int = NORM_CHUNK) -> Tensor:
    """() float64: sum of grad**2, each chunk of ``chunk`` elements squared and summed in float32 and the
    chunks' sums added in float64, so no full-size copy (float64 or float32) of a large partition exists.
    A non-finite element gives a non-finite sum (the skip rule sees it)."""
    flat = grad.reshape(-1)  # (P,) a view for the contiguous grads DeepSpeed hands over
    total = torch.zeros((), dtype=torch.float64, device=grad.device)
    for start in range(0, flat.numel(), chunk):
        part = flat[start : start + chunk].float()  # (<= chunk,)
        total += torch.dot(part, part).double()
    return total


class GuardedAdamW(torch.optim.AdamW):
    """AdamW whose ``step`` applies the global grad-norm rule (skip if non-finite or > skip, else clip).

    DeepSpeed calls ``step`` once per engine step with one param group: the model's parameters under
    ZeRO-0 (gradients already averaged and complete on every rank), or this rank's flat fp32 partition
    under ZeRO 1/2 (and 3 with one sub-group), where ``partitioned=True`` all-reduces the squared sums.
    A skipped step zeroes the gradients and leaves parameters and moments untouched.
    """

    def __init__(
        self,
        params: Any,
        *,
        lr: float,
        betas: tuple[float, float],
        weight_decay: float,
        grad_clip: float,
        skip_grad_norm: float,
        partitioned: bool,
    ) -> None:
        super().__init__(params, lr=lr, betas=betas, weight_decay=weight_decay)
        self.grad_clip = grad_clip
        self.skip_grad_norm = skip_grad_norm
        self.partitioned = partitioned
        self.overflow = False  # read by DeepSpeed's ZeRO-0 engine: counts skipped steps
        self.last_grad_norm = math.inf  # reset before each engine step; stays inf if ZeRO skipped first

    def begin(self) -> None:
        """Mark the coming engine step as skipped until ``step`` runs (ZeRO may skip without calling it)."""
        self.last_grad_norm, self.overflow = math.inf, True

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        params = [p for g in self.param_groups for p in g["params"] if p.grad is not None]
        device = params[0].grad.device if params else torch.device("cpu")
        sq = torch.zeros((), dtype=torch.float64, device=device)
        for p in params:
            sq += squared_sum(p.grad)
        if self.partitioned and dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(sq)
        norm = float(sq.sqrt())
        self.last_grad_norm = norm
        self.overflow = not math.isfinite(norm) or norm > self.skip_grad_norm
        if self.overflow:
            for p in params:
                p.grad = None
            return None
        scale = self.grad_clip / (norm + 1e-6)
        if scale < 1.0:
            for p in params:
                p.grad.mul_(scale)
        return super().step(closure)


def make_optimizer(model: torch.nn.Module, cfg: LearnerConfig) -> GuardedAdamW:
    """The client optimiser DeepSpeed wraps (a torch optimiser: no fused-Adam op to compile)."""
    return GuardedAdamW(
        [p for p in model.parameters() if p.requires_grad],
        lr=cfg.lr,
        betas=cfg.betas,
        weight_decay=cfg.weight_decay,
        grad_clip=cfg.grad_clip,
        skip_grad_norm=cfg.skip_grad_norm,
        partitioned=cfg.zero_stage >= 1,
    )


def deepspeed_config(cfg: LearnerConfig, *, world_size: int, dtype: str) -> dict[str, Any]:
    """DeepSpeed's config: no GAS division (the learner sets the accumulation boundary), no clipping."""
    zero: dict[str, Any] = {"stage": cfg.zero_stage}
    if cfg.zero_stage == 3:
        zero["sub_group_size"] = 10**12  # one sub-group: GuardedAdamW.step runs once per engine step
    return {
        "train_micro_batch_size_per_gpu": cfg.micro_batch_size,
        "gradient_accumulation_steps": 1,  # accumulation boundary set by hand; no division by GAS
        "train_batch_size": cfg.micro_batch_size * world_size,
        "gradient_clipping": 0.0,  # GuardedAdamW applies the grad-norm rule
        "zero_optimization": zero,
        "zero_allow_untested_optimizer": True,  # GuardedAdamW is a torch AdamW subclass
        "bf16": {"enabled": dtype == "bfloat16"},
        "fp16": {"enabled": dtype == "float16"},
        "steps_per_print": 2**62,
        "wall_clock_breakdown": False,
    }
