"""Shared pieces of the device check's GPU-question parts (``bench/learner/device_questions.py``): the
Qwen2.5-Math-7B layer shape with fewer layers, its random model (untied head, as the 7B), the 7B recipe's
learner section at one rank, long-tailed response lengths and the groups built from them, and the
device memory counters (zero on CPU, where the allocator keeps no statistics)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from exgrpo.core.config import Config, from_dict
from exgrpo.core.records import Group, Trajectory

GIB = 2**30
RECIPE_7B = Path(__file__).resolve().parents[2] / "configs" / "qwen2.5-math-7b.yaml"


@dataclass(frozen=True)
class Sizes:
    """A Qwen2 decoder's sizes and the workload the questions use on it."""

    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    vocab: int
    layers: int
    max_prompt_len: int  # the recipe's (the smoke's own on CPU)
    max_response_len: int
    micro_batch: int  # learners.micro_batch_size
    token_budget: int  # learners.max_tokens_per_micro_batch
    chunk_tokens: int  # learners.logits_chunk_tokens
    median_response: int  # long-tailed lengths: lognormal with this median ...
    sigma: float  # ... and this log-space spread, capped at max_response_len


# Qwen2.5-Math-7B's layer shapes (config.json of Qwen/Qwen2.5-Math-7B) with the 7B recipe's lengths
QWEN7B = Sizes(3584, 18944, 28, 4, 152064, 2, 1024, 8192, 4, 9216, 4096, 1200, 0.9)
SMOKE = Sizes(64, 128, 4, 2, 512, 2, 16, 64, 4, 96, 32, 12, 0.9)


def with_layers(sizes: Sizes, layers: int | None) -> Sizes:
    return sizes if layers is None else dataclasses.replace(sizes, layers=layers)


def build_model(sizes: Sizes, *, dtype: torch.dtype, device: torch.device) -> torch.nn.Module:
    """A random Qwen2 causal LM of ``sizes`` with an untied lm_head and rope base 40,000 (as Qwen2.5-Math-7B)."""
    from bench.learner.gpu_learner import build_model as build_qwen2

    return build_qwen2(
        sizes,
        dtype=dtype,
        device=device,
        max_positions=sizes.max_prompt_len + sizes.max_response_len,
        tied=False,
        rope_theta=40_000.0,  # the 7B recipe's
    )


def start_learner(cfg: Config, model_dir: str, *, max_response_len: int) -> Any:
    """The project's `Learner` over ``model_dir`` under ``cfg``'s learner section, set up (world size 1)."""
    from exgrpo.transport.ranks import free_port
    from learners.learner import Learner

    learner = Learner(
        model_path=model_dir,
        learner=cfg.learners,
        loss=cfg.loss,
        max_response_len=max_response_len,
        master_port=free_port(),
        dtype=cfg.model.dtype,
    )
    learner.setup()
    return learner


def save_model(sizes: Sizes, path: str, *, dtype: str, device: torch.device) -> int:
    """Build ``sizes``' random model on ``device``, save it to ``path`` (safetensors), free it; its parameters."""
    torch.manual_seed(0)
    model = build_model(sizes, dtype=getattr(torch, dtype), device=device)
    params = sum(p.numel() for p in model.parameters())
    model.save_pretrained(path)
    del model
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return params


def one_rank(learners: dict[str, Any], *, cuda: bool, **settings: Any) -> dict[str, Any]:
    """A recipe's learners section at one rank on this device (NCCL on a GPU, gloo on a CPU), with `settings`."""
    device = {"num_gpus": 1 if cuda else 0, "backend": "nccl" if cuda else "gloo"}
    return {**learners, "num": 1, "num_cpus": 1, **device, **settings}


def recipe_config(sizes: Sizes, *, cuda: bool, zero_stage: int | None = None) -> Config:
    """The 7B recipe's model, learner and loss sections at one rank (``learners.num: 1``), with ``sizes``'
    lengths and micro-batching (the recipe's own on the GPU shape), and ``zero_stage`` when given."""
    import yaml

    recipe = yaml.safe_load(RECIPE_7B.read_text())
    learners = one_rank(
        recipe["learners"],
        cuda=cuda,
        micro_batch_size=sizes.micro_batch,
        max_tokens_per_micro_batch=sizes.token_budget,
        logits_chunk_tokens=sizes.chunk_tokens,
    )
    if zero_stage is not None:
        learners["zero_stage"] = zero_stage
    model = {
        "dtype": recipe["model"]["dtype"],
        "max_prompt_len": sizes.max_prompt_len,
        "max_response_len": sizes.max_response_len,
    }
    return from_dict({"model": model, "learners": learners, "loss": recipe["loss"]})


def response_lengths(sizes: Sizes, n: int, *, seed: int) -> list[int]:
    """``n`` long-tailed response lengths: lognormal (median ``median_response``, log-spread ``sigma``),
    at least 1, capped at ``max_response_len`` (a capped response is a truncated one, as in a run)."""
    rng = np.random.default_rng(seed)
    raw = rng.lognormal(math.log(sizes.median_response), sizes.sigma, size=n)
    return [int(min(sizes.max_response_len, max(1, round(x)))) for x in raw]


def prompt_lengths(sizes: Sizes, n: int, *, seed: int) -> list[int]:
    """``n`` prompt lengths, uniform in [max_prompt_len / 8, max_prompt_len / 2] (math questions are short)."""
    rng = np.random.default_rng(seed + 1)
    lo, hi = max(1, sizes.max_prompt_len // 8), max(2, sizes.max_prompt_len // 2)
    return [int(x) for x in rng.integers(lo, hi, size=n)]


def long_tail_groups(
    sizes: Sizes, *, groups: int, rollouts: int, seed: int, full_first: bool = False
) -> list[Group]:
    """``groups`` groups of ``rollouts`` random-token rollouts with long-tailed response lengths and 0/1
    rewards (non-zero advantages in every group). ``full_first``: each group's prompt is max_prompt_len long
    and its first rollout max_response_len long (the recipe's longest sequence: the planned worst case)."""
    rng = np.random.default_rng(seed)
    lengths = response_lengths(sizes, groups * rollouts, seed=seed)
    prompts = prompt_lengths(sizes, groups, seed=seed)
    behaviour = -math.log(sizes.vocab)
    out = []
    for q in range(groups):
        qid = f"s{seed}q{q}"
        rewards = [1.0, 0.0] + [float(x) for x in rng.integers(0, 2, size=rollouts - 2)]
        trajs = []
        for i in range(rollouts):
            n = lengths[q * rollouts + i]
            if full_first and i == 0:
                n = sizes.max_response_len
            ids = tuple(int(t) for t in rng.integers(1, sizes.vocab, size=n))
            trajs.append(Trajectory(qid, ids, (behaviour,) * n, rewards[i], policy_version=seed))
        p = sizes.max_prompt_len if full_first else prompts[q]
        prompt = tuple(int(t) for t in rng.integers(1, sizes.vocab, size=p))
        out.append(Group(qid, prompt, tuple(trajs), kind="fresh", policy_version=seed))
    return out


# ------------------------------------------------------------------------------------------- memory
def allocated(device: torch.device) -> int:
    return torch.cuda.memory_allocated(device) if device.type == "cuda" else 0


def peak(device: torch.device) -> int:
    return torch.cuda.max_memory_allocated(device) if device.type == "cuda" else 0


def reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)


def gib(n: float | None) -> float | None:
    return None if n is None else n / GIB


def setup_device(device: str) -> torch.device:
    """The part's device: set as current on CUDA; one torch thread on CPU (two on two cores slow generation several-fold)."""
    dev = torch.device(device)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    else:
        torch.set_num_threads(1)
    return dev


def timed(fn: Any, device: torch.device) -> float:
    """Seconds of ``fn()`` between device synchronisations."""
    import time

    from bench.common import synchronize

    synchronize(device)
    t0 = time.perf_counter()
    fn()
    synchronize(device)
    return time.perf_counter() - t0
