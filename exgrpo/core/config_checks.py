"""The valid values of a config: each numeric setting's range (`BOUNDS`) and the rules across fields.

`validate` is the one place a loaded config is checked as a whole (`exgrpo.core.config.from_dict`
calls it); every error names the field and the fix, and all of them are reported at once.
"""

from __future__ import annotations

import functools
import math
from dataclasses import fields
from typing import Any

from exgrpo.core.bounds import Bound
from exgrpo.core.config_sections import Config, ConfigError, yaml_key

# Engines that share one GPU (samplers.num_gpus < 1) may take at most this share of their slice of it each:
# vLLM's CUDA context and the buffers it allocates after sizing its KV cache (weight receive buffers,
# NCCL) sit outside `gpu_memory_utilization`, and a second engine starts only if its share is still free.
SHARED_GPU_SHARE = 0.9

# The simple numeric ranges, one per setting (YAML names); cross-field rules are in `validate`.
BOUNDS: dict[str, Bound] = {
    "model.max_prompt_len": Bound(lo=1),
    "model.max_response_len": Bound(lo=1),
    "data.num_train": Bound(lo=1),
    "data.num_eval": Bound(lo=0),
    "data.fresh_per_step": Bound(
        lo=1, hi="trainer.questions_per_step", note="or null: the batch's questions not drawn from replay"
    ),
    "samplers.num": Bound(lo=1, note="scale down to 1, not 0"),
    "samplers.num_cpus": Bound(lo=0),
    "samplers.num_gpus": Bound(lo=0),
    "samplers.temperature": Bound(lo=0, open_lo=True),
    "samplers.top_p": Bound(lo=0, hi=1, open_lo=True),
    "samplers.requests_per_call": Bound(lo=1),
    "samplers.continuous_max_requests": Bound(lo=1),
    "samplers.verify_timeout_s": Bound(lo=0, open_lo=True),
    "samplers.node_probe_s": Bound(lo=0, note="0 = off"),
    "samplers.gpu_memory_utilization": Bound(lo=0, hi=1, open_lo=True),
    "samplers.tensor_parallel_size": Bound(lo=1, note="1 = one GPU per sampler"),
    "samplers.autoscale_min": Bound(lo=1, hi="samplers.autoscale_max", note="the fewest samplers; 1 or more"),
    "samplers.autoscale_max": Bound(lo=1, note="the most samplers the policy may ask for"),
    "samplers.autoscale_up_wait": Bound(lo=0, hi=1, open_lo=True, open_hi=True, note="a share of a step"),
    "samplers.autoscale_down_idle": Bound(lo=0, hi=1, open_lo=True, open_hi=True, note="a share of a step"),
    "samplers.autoscale_hysteresis": Bound(lo=1, note="1 = change on the first step the signal holds"),
    "samplers.autoscale_cooldown": Bound(lo=0, note="0 = a change may follow the next step"),
    "samplers.preempt_grace_s": Bound(lo=0, note="0 = hand requests back at the drain deadline itself"),
    "model.max_position_embeddings": Bound(lo=1, note="or null: the model's own"),
    "model.rope_theta": Bound(lo=0, open_lo=True, note="or null: the model's own"),
    "async.weight_timeout_s": Bound(lo=0, open_lo=True),
    "learners.collective_timeout_s": Bound(
        lo=0, open_lo=True, note="or null: derived from async.weight_timeout_s"
    ),
    "async.max_weight_failures": Bound(lo=1),
    "learners.max_tokens_per_micro_batch": Bound(lo=1, note="or null: micro_batch_size sequences"),
    "learners.logits_chunk_tokens": Bound(lo=1),
    "replay.rho": Bound(lo=0, hi=1, note="0.5 = half of each batch from replay"),
    "replay.start_solve_ratio": Bound(lo=0, hi=1),
    "replay.num_shards": Bound(lo=1),
    "replay.mu": Bound(
        lo=0, hi="trainer.rollouts_per_question", open_lo=True, open_hi=True, note="or null: K/2"
    ),
    "replay.sigma": Bound(lo=0, open_lo=True),
    "replay.max_trajectories_per_question": Bound(lo=1),
    "replay.max_age": Bound(lo=0, note="policy versions, or null for any age"),
    "replay.shard_max_restarts": Bound(lo=0),
    "replay.wal_compact_mb": Bound(lo=0, open_lo=True),
    "replay.shard_concurrency": Bound(lo=1, note="1 = one call at a time"),
    "learners.num": Bound(lo=1),
    "learners.num_cpus": Bound(lo=0),
    "learners.num_gpus": Bound(lo=0),
    "learners.zero_stage": Bound(lo=0, hi=3),
    "learners.lr": Bound(lo=0, open_lo=True),
    "learners.weight_decay": Bound(lo=0),
    "learners.grad_clip": Bound(lo=0, open_lo=True),
    "learners.skip_grad_norm": Bound(lo=0, open_lo=True),
    "learners.minibatches": Bound(lo=1, note="1 = one optimiser step per training step"),
    "learners.grad_share_every": Bound(lo=0, note="0 = off"),
    "learners.micro_batch_size": Bound(lo=1),
    "loss.clip_eps": Bound(lo=0, hi=1, open_lo=True, open_hi=True),
    "loss.beta": Bound(lo=0, open_lo=True, note="policy shaping w / (w + beta)"),
    "loss.tis_cap": Bound(lo=1, note="or null: off"),
    "async.max_staleness": Bound(lo=0, note="0 = synchronous"),
    "trainer.steps": Bound(lo=1),
    "trainer.questions_per_step": Bound(lo=1),
    "trainer.rollouts_per_question": Bound(lo=2, note="K: group advantages need two rollouts"),
    "trainer.eval_every": Bound(lo=0, note="0 = only before and after"),
    "trainer.eval_samples": Bound(lo=1),
    "trainer.checkpoint_every": Bound(lo=0, note="0 = only at the end"),
    "trainer.keep_checkpoints": Bound(lo=1),
    "trainer.max_failures": Bound(
        lo=0, note="or null: 3 when attached to a cluster (RAY_ADDRESS, ray job submit), 0 on a local one"
    ),
    "logging.dashboard_port": Bound(lo=1, hi=65535, note="a TCP port"),
    "learners.lora_rank": Bound(lo=0, note="0 = off"),
    "loss.kl_coef": Bound(lo=0, note="0 = off"),
    "logging.samples_every": Bound(lo=0, note="0 = no samples"),
    "logging.samples_per_step": Bound(lo=0, note="0 = no samples"),
    "checks.checksum_tolerance": Bound(lo=0, open_lo=True, hi=1, note="a share of the layer's sum of |w|"),
    "checks.logprob_bound": Bound(lo=0, open_lo=True, note="nats"),
    "checks.logprob_max_share": Bound(lo=0, hi=1),
    "checks.logprob_min_tokens": Bound(lo=1),
    "checks.max_failures": Bound(lo=0, note="0 = never stop: the checks only log"),
}

# The numeric settings with no range in BOUNDS, each with what is valid instead (a rule in `validate`, or any
# value), as the settings reference prints it; tests/exgrpo/core/test_config_bounds.py walks every field and
# fails for a numeric setting in neither table.
NO_RANGE: dict[str, str] = {
    "data.seed": "any integer",
    "trainer.seed": "any integer",
    "loss.entropy_coef": "any value (< 0 rewards lower entropy)",
    "learners.lora_alpha": "> 0 when learners.lora_rank > 0",
    "learners.betas": "each in [0, 1)",
}


def validate(cfg: Config) -> None:
    """Every setting in its range (`BOUNDS`), then the rules across fields; each error names the field
    and the fix, all of them at once."""
    t, lr, s = cfg.trainer, cfg.learners, cfg.samplers
    value_of = functools.partial(setting, cfg)
    errors = [msg for key, bound in BOUNDS.items() if (msg := bound.error(key, value_of)) is not None]
    checks: list[tuple[bool, str]] = [
        (
            lr.grad_share_every == 0 or lr.zero_stage < 3,
            "learners.grad_share_every needs whole parameters on each rank: use learners.zero_stage <= 2 "
            "or set it to 0",
        ),
        (
            lr.num < 1 or t.questions_per_step % lr.num == 0,  # learners.num < 1 has its own message
            f"trainer.questions_per_step={t.questions_per_step} is not divisible across learners.num={lr.num}: "
            f"every learner rank needs whole groups; make questions_per_step a multiple of {lr.num}",
        ),
        (
            lr.num * lr.minibatches < 1 or t.questions_per_step % (lr.num * lr.minibatches) == 0,
            f"trainer.questions_per_step={t.questions_per_step} must split into learners.minibatches={lr.minibatches} "
            f"mini-batches on each of learners.num={lr.num} ranks; use a multiple of {lr.num * lr.minibatches}",
        ),
        (
            lr.lora_rank == 0 or lr.lora_alpha > 0,
            f"learners.lora_alpha={lr.lora_alpha} must be > 0 (with learners.lora_rank > 0)",
        ),
        (lr.lora_rank == 0 or bool(lr.lora_target_modules), "learners.lora_target_modules is empty"),
        (
            lr.lora_rank == 0 or lr.zero_stage < 3,
            "learners.lora_rank > 0 needs whole base weights on each rank to merge the adapters for the "
            "samplers: use learners.zero_stage <= 2 (the adapters' optimiser state is small) or lora_rank=0",
        ),
        (
            cfg.loss.kl_coef == 0 or lr.zero_stage < 3,
            "loss.kl_coef > 0 keeps the reference policy unpartitioned on every learner rank: use "
            "learners.zero_stage <= 2 or loss.kl_coef=0",
        ),
        (
            cfg.async_.weight_sync != "collective" or s.engine == "vllm",
            "async.weight_sync=collective is vLLM's weight-transfer API and needs samplers.engine=vllm; "
            "transformers samplers take their weights through async.weight_sync=object_store",
        ),
        (
            cfg.async_.weight_sync != "collective" or (s.num_gpus > 0) == (lr.num_gpus > 0),
            "async.weight_sync=collective needs learners and samplers on the same kind of device (NCCL between "
            f"GPUs, gloo between CPUs); got learners.num_gpus={lr.num_gpus}, samplers.num_gpus={s.num_gpus}",
        ),
        (
            not (cfg.model.dtype == "bfloat16" and lr.zero_stage == 0),
            "model.dtype=bfloat16 with learners.zero_stage=0 trains through DeepSpeed's loss-scaled bfloat16 "
            "optimizer, whose gradients drift from float32 (grad norm 6% off after 3 updates of a test model, "
            "where ZeRO 1-3 stay within 0.2%): use learners.zero_stage=1 or more, which keeps float32 gradient "
            "partitions and master weights",
        ),
        (
            not (s.engine == "vllm" and cfg.model.dtype == "float16" and s.num_gpus == 0),
            "model.dtype=float16 is not supported by vLLM on CPU; use float32 or bfloat16",
        ),
        (
            not s.continuous
            or (
                s.engine == "vllm"
                and cfg.async_.weight_sync == "object_store"
                and s.tensor_parallel_size == 1
            ),
            "samplers.continuous=true is the continuous-batching vLLM sampler: it needs samplers.engine=vllm, "
            "async.weight_sync=object_store and samplers.tensor_parallel_size=1 (or samplers.continuous=false)",
        ),
        (
            s.tensor_parallel_size == 1 or s.engine == "vllm",
            f"samplers.tensor_parallel_size={s.tensor_parallel_size} is vLLM's tensor parallelism and needs "
            "samplers.engine=vllm; transformers samplers run on one device (tensor_parallel_size=1)",
        ),
        (
            s.tensor_parallel_size == 1 or 0 < s.num_gpus <= 1,
            f"samplers.tensor_parallel_size={s.tensor_parallel_size} needs GPU samplers with one GPU (or a share "
            f"of one) per tensor-parallel rank: 0 < samplers.num_gpus <= 1, got {s.num_gpus} (vLLM on CPU has no "
            "tensor parallelism here; use tensor_parallel_size=1)",
        ),
        (
            lr.num_cpus + lr.num_gpus > 0,
            "learners.num_cpus and learners.num_gpus are both 0: a learner's placement-group bundle must "
            "reserve something; set learners.num_cpus=1",
        ),
    ]
    errors += [msg for ok, msg in checks + _gpu_sampler_checks(cfg) + _no_range_checks(cfg) if not ok]
    if errors:
        raise ConfigError("invalid config:\n  - " + "\n  - ".join(errors))


def _no_range_checks(cfg: Config) -> list[tuple[bool, str]]:
    """The rules of the settings a single range cannot state (`NO_RANGE`), and the autoscale range's fit with
    samplers.num."""
    lr, s = cfg.learners, cfg.samplers
    return [
        (
            all(0 <= b < 1 for b in lr.betas),
            f"learners.betas={list(lr.betas)}: AdamW's betas must each lie in [0, 1), e.g. [0.9, 0.999]",
        ),
        (
            not s.autoscale or s.autoscale_min <= s.num <= s.autoscale_max,
            f"samplers.num={s.num} lies outside [samplers.autoscale_min, samplers.autoscale_max] = "
            f"[{s.autoscale_min}, {s.autoscale_max}] with samplers.autoscale=true: the run would start "
            "with one count and the policy move it at once; set samplers.num inside the range",
        ),
    ]


def _gpu_sampler_checks(cfg: Config) -> list[tuple[bool, str]]:
    """What cannot work with samplers on GPUs: shared GPUs under NCCL or beyond their memory, HF samplers that
    would never use their GPU, tensor parallelism that has never run on one."""
    s = cfg.samplers
    return [
        (
            cfg.async_.weight_sync != "collective" or s.num_gpus == 0 or _whole_gpus(s.num_gpus),
            f"async.weight_sync=collective with samplers.num_gpus={s.num_gpus:g}: every sampler engine rank "
            "joins one NCCL world with learner rank 0, and NCCL refuses two ranks on one device; use "
            "samplers.num_gpus=1 (a whole GPU per engine rank), or async.weight_sync=object_store",
        ),
        (
            not (s.engine == "vllm" and 0 < s.num_gpus < 1)
            or s.gpu_memory_utilization <= SHARED_GPU_SHARE * s.num_gpus + 1e-9,
            f"samplers.num_gpus={s.num_gpus:g} shares one GPU between vLLM engines, but each engine takes "
            f"samplers.gpu_memory_utilization={s.gpu_memory_utilization:g} of the whole device, more than its "
            f"{s.num_gpus:g} share less what vLLM allocates outside that figure (its CUDA context, weight "
            "buffers): the later engines fail to start; set samplers.gpu_memory_utilization <= "
            f"{_floor3(SHARED_GPU_SHARE * s.num_gpus):g} (num_gpus x {SHARED_GPU_SHARE:g}), or samplers.num_gpus=1",
        ),
        (
            not (s.engine == "hf" and s.num_gpus > 0),
            f"samplers.engine=hf with samplers.num_gpus={s.num_gpus:g}: the transformers sampler "
            "(actors/engines.py, HFEngine) never moves its model to the GPU, so it would generate on the CPU "
            "while holding the GPU; use samplers.engine=vllm on GPUs, or samplers.num_gpus=0",
        ),
        (
            s.tensor_parallel_size == 1 or s.num_gpus == 0 or s.allow_untested_tp,
            f"samplers.tensor_parallel_size={s.tensor_parallel_size} on GPUs is untested: no tensor-parallel "
            "sampler has run on a GPU yet (its weight-transfer ranks and placement are tested on CPU only); "
            "use samplers.tensor_parallel_size=1 (more samplers instead of larger ones), or set "
            "samplers.allow_untested_tp=true to try it",
        ),
    ]


def _whole_gpus(n: float) -> bool:
    """A whole number of GPUs, at least one (a share of a GPU puts two NCCL ranks on one device)."""
    return n >= 1 and float(n).is_integer()


def _floor3(x: float) -> float:
    """x rounded down to 3 decimals (a non-finite x as it is: every message is built, even for valid configs)."""
    return math.floor(x * 1000 + 1e-9) / 1000 if math.isfinite(x) else x


def field_name(cls: type, key: str) -> str | None:
    """The field of `cls` whose YAML name is `key`; None when there is none."""
    names = {yaml_key(f.name): f.name for f in fields(cls)}
    return names.get(key)


def setting(cfg: Config, key: str) -> Any:
    """The value of a YAML-named setting (`"replay.rho"`, `"async.max_staleness"`) in `cfg`."""
    section, _, name = key.partition(".")
    attr = field_name(Config, section)
    if attr is None or not hasattr(getattr(cfg, attr), name):
        raise KeyError(f"no config setting {key!r}")
    return getattr(getattr(cfg, attr), name)
