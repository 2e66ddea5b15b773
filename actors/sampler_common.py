"""What both samplers share (`actors.sampler.Sampler`, `actors.continuous_sampler.ContinuousSampler`).

`EngineSpec`: how a sampler builds its engine in its own process (`engine_kwargs`: the vLLM arguments);
`SamplerSettings`: what it samples and scores with (both constructors take it). `check_positions` refuses
an engine context longer than the model's position limit before minutes of start-up. `request_seed`: the
base sampling seed of a request, disjoint between requests (see `actors.sampler`). `reward_failures` and
`new_failure_notes`: the rewards scored 0 for want of a verdict, and the first failure of each kind,
reported to the driver once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from exgrpo.core.config import Dtype, EngineKind, TemplateName
from exgrpo.core.positions import OVERRIDE_HINT, position_limit, read_config
from exgrpo.verify.rewards import MATH


@dataclass(frozen=True)
class EngineSpec:
    """How a sampler builds its engine inside its own process (the sampling seed is the sampler's)."""

    kind: EngineKind
    model_path: str
    dtype: Dtype = "float32"
    gpu_memory_utilization: float = 0.85
    weight_transfer: str | None = (
        None  # vLLM weight-transfer backend ("nccl", "gloo") for the collective transport
    )
    max_model_len: int | None = (
        None  # prompt + response tokens (vLLM's max_model_len); None = the model's own
    )
    tensor_parallel_size: int = 1  # vLLM workers (GPUs) of this engine
    enforce_eager: bool | None = None  # vLLM without CUDA graphs; None = eager on CPU, CUDA graphs on GPU
    gpus_per_worker: float = 1.0  # GPU share of each vLLM worker when tensor_parallel_size > 1
    engine_process: str = "inline"  # vLLM's engine core: "inline" (this process) or "child" (its own process)


@dataclass(frozen=True)
class SamplerSettings:
    """How a sampler samples and scores, whichever kind it is (`exgrpo.runtime.parts.SamplerSpawner` builds one
    from the config for all its samplers; it travels to each actor with `.remote`, so it stays picklable)."""

    template: TemplateName  # model.template: how a prompt is rendered, and the reward's mode
    max_response_len: int  # model.max_response_len: the token cap of a response
    temperature: float = 1.0
    top_p: float = 1.0
    verify_timeout_s: float = 5.0  # the verifier's deadline per answer
    reward_fn: str = MATH  # reward.fn: the built-in verifier or the user's function
    seed: int = 0  # trainer.seed: the engine's seed and the base of every request's (`request_seed`)
    rollouts_per_question: int = 8  # K: the seed stride of a request
    seeded: bool = True  # requests (and evaluation samples) carry a seed; False: none (vLLM's batched path)
    # checks.checksum: sum the served weights per layer after every load or update (`RolloutResult.served_sums`)
    weight_sums: bool = False


def engine_kwargs(spec: EngineSpec) -> dict[str, Any]:
    """The vLLM-only arguments of `make_engine` for `spec` (none for transformers)."""
    if spec.kind != "vllm":
        return {}
    return {
        "gpu_memory_utilization": spec.gpu_memory_utilization,
        "weight_transfer": spec.weight_transfer,
        "max_model_len": spec.max_model_len,
        "tensor_parallel_size": spec.tensor_parallel_size,
        "enforce_eager": spec.enforce_eager,
        "gpus_per_worker": spec.gpus_per_worker,
        "engine_process": spec.engine_process,
    }


SEED_SPAN = 2**40  # seeds of one run seed: request ids below 2**40 / K never reach the next run seed's


def request_seed(run_seed: int, request_id: int, stride: int, *, n: int | None = None) -> int:
    """Base sampling seed of a request: completion j of it is drawn with seed + j (vLLM's children).

    seed = run_seed * 2**40 + request_id * stride, with stride = K (the most completions a request asks
    for), so requests r != r' of one run never share a seed: [r*K, r*K + n) and [r'*K, r'*K + n') are
    disjoint for n, n' <= K."""
    if n is not None and n > stride:
        raise ValueError(
            f"request {request_id} asks for {n} completions, more than the seed stride {stride} "
            "(trainer.rollouts_per_question): its seeds would overlap the next request's"
        )
    if request_id < 0 or (request_id + 1) * stride > SEED_SPAN:
        raise ValueError(
            f"request id {request_id} is outside the seed range of a run (0 <= id < 2**40 / {stride})"
        )
    return run_seed * SEED_SPAN + request_id * stride


def check_positions(spec: EngineSpec) -> None:
    """Refuse an engine whose context (`max_model_len`) exceeds its model's `max_position_embeddings`."""
    config = read_config(spec.model_path) if spec.max_model_len is not None else None
    limit = None if config is None else position_limit(config)
    if limit is not None and spec.max_model_len is not None and spec.max_model_len > limit:
        raise ValueError(
            f"the samplers' context model.max_prompt_len + model.max_response_len = {spec.max_model_len} "
            f"tokens exceeds max_position_embeddings={limit} of {spec.model_path}/config.json: responses would "
            f"be cut short; {OVERRIDE_HINT}"
        )


def reward_failures(scorer: Any) -> int:
    """Rewards a scorer has scored 0 for want of a verdict: deadlines passed, reward functions that raised."""
    stats = scorer.stats()
    return stats.timeouts + getattr(stats, "errors", 0)


def new_failure_notes(scorer: Any, noted: set[str]) -> tuple[tuple[str, str], ...]:
    """The first failure of each kind the scorer saw that this sampler has not reported yet (adds them to `noted`)."""
    first = getattr(scorer.stats(), "first_failures", None) or {}
    new = tuple((kind, text) for kind, text in sorted(first.items()) if kind not in noted)
    noted.update(kind for kind, _ in new)
    return new
