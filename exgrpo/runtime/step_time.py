"""The time a GPU run's step and whole run would take at the rates recorded here (`--dry-run` prints it).

A rough figure, built from the only GPU figures this project has recorded and nothing else: every response runs
to `model.max_response_len` and every prompt to `model.max_prompt_len` (which errs long); generation at
``ASSUMED_GPU_TOKENS_PER_S`` per sampler (HF `generate` of the 1.5B shape on one H200; vLLM on a GPU has not been
measured and should be faster); the learner's update at ``RECORDED_LEARNER_TOKENS_PER_S`` per rank, scaled by
parameter count from the 1.5B shape it was measured on (the project's `Learner`, ZeRO-2, one H200, gradient
checkpointing, 8192 tokens a sequence: docs/benchmarks.md, "GPU device check"); ranks and samplers assumed to add
up linearly (no multi-GPU run has been timed). Not counted: the weight push, checkpoints, held-out evaluation and
start-up. docs/gpu.md ("How long a run takes") lists the recipes' figures.
"""

from __future__ import annotations

from dataclasses import dataclass

from exgrpo.core.config import Config
from exgrpo.runtime.longest_call import ASSUMED_GPU_TOKENS_PER_S
from exgrpo.runtime.memory_plan import KNOWN, read_shape

# The device check's learner part on one H200 (2026-12-04; docs/benchmarks.md, "GPU device check"): the project's
# Learner, ZeRO-2, bf16, gradient checkpointing, logits in chunks, 16 sequences of 512 + 7680 tokens per update,
# 6.98 s per update: 18,774 (prompt + response) tokens/s on the random 1.5B-shaped model.
RECORDED_LEARNER_TOKENS_PER_S = 18_774.0
RECORDED_LEARNER_PARAMS = KNOWN["qwen2.5-math-1.5b"].params


@dataclass(frozen=True)
class StepEstimate:
    """Seconds per step and their parts (None: no rate recorded for that part)."""

    generation_s: float | None
    update_s: float | None
    overlapped: bool  # async.max_staleness >= 1: the samplers generate the next step during the update
    steps: int
    gpus: float

    @property
    def step_s(self) -> float | None:
        if self.generation_s is None or self.update_s is None:
            return None
        if self.overlapped:
            return max(self.generation_s, self.update_s)
        return self.generation_s + self.update_s

    @property
    def run_s(self) -> float | None:
        return None if self.step_s is None else self.step_s * self.steps


def model_params(cfg: Config) -> int | None:
    """The model's parameter count from its config.json or the known recipe shapes (None when neither has it)."""
    try:
        return read_shape(cfg.model.path).params
    except (ValueError, OSError, KeyError):
        return None


def estimate(cfg: Config, params: int | None) -> StepEstimate:
    """The per-step parts at the recorded rates, every sequence at the length caps."""
    s, lr, t, m = cfg.samplers, cfg.learners, cfg.trainer, cfg.model
    sequences = t.questions_per_step * t.rollouts_per_question
    generation = None
    if s.num_gpus > 0 and s.num > 0:
        generation = sequences * m.max_response_len / (s.num * ASSUMED_GPU_TOKENS_PER_S)
    update = None
    if lr.num_gpus > 0 and params:
        rate = RECORDED_LEARNER_TOKENS_PER_S * RECORDED_LEARNER_PARAMS / params
        update = sequences * (m.max_prompt_len + m.max_response_len) / (lr.num * rate)
    gpus = s.num * s.num_gpus * s.tensor_parallel_size + lr.num * lr.num_gpus
    return StepEstimate(generation, update, cfg.async_.max_staleness >= 1, t.steps, gpus)


def _count(n: int, what: str) -> str:
    return f"{n} {what}" + ("" if n == 1 else "s")


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    if seconds < 3 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 3600:.0f} h ({seconds / 86400:.1f} days)"


def step_time(cfg: Config, *, params: int | None = None) -> str:
    """What `--dry-run` prints for a run with GPU learners or samplers ("" for a CPU run): the estimate per step
    and for the whole run, and each part with the rate it rests on."""
    s, lr, t, m = cfg.samplers, cfg.learners, cfg.trainer, cfg.model
    if s.num_gpus == 0 and lr.num_gpus == 0:
        return ""
    params = params if params is not None else model_params(cfg)
    e = estimate(cfg, params)
    b, k = t.questions_per_step, t.rollouts_per_question
    if e.generation_s is not None:
        gen = (
            f"at most B={b} x K={k} x model.max_response_len={m.max_response_len} tokens over {_count(s.num, 'sampler')} at "
            f"{ASSUMED_GPU_TOKENS_PER_S:.0f} tokens/s each = {e.generation_s:.0f} s (HF generate of the 1.5B "
            "shape on one H200, the only GPU generation rate recorded, assumed for every model size; vLLM not "
            "measured, should be faster)"
        )
    else:
        gen = "not estimated (CPU samplers: no rate assumed)"
    if e.update_s is not None and params:
        upd = (
            f"B x K x (max_prompt_len {m.max_prompt_len} + max_response_len {m.max_response_len}) tokens over "
            f"{_count(lr.num, 'learner rank')} at {RECORDED_LEARNER_TOKENS_PER_S:,.0f} tokens/s x "
            f"{RECORDED_LEARNER_PARAMS / 1e9:.2f} B / {params / 1e9:.2f} B parameters = {e.update_s:.0f} s "
            "(the Learner's update of the 1.5B shape on one H200, ZeRO-2, checkpointing, 8192 tokens a sequence: "
            'docs/benchmarks.md, "GPU device check"; ranks assumed to scale linearly, not measured)'
        )
    elif lr.num_gpus == 0:
        upd = "not estimated (CPU learners: no rate assumed)"
    else:
        upd = "not estimated (the model's parameter count is unknown: no config.json and no known shape)"
    head = (
        "time estimate (the only GPU rates recorded, every sequence at its length caps; no GPU has run this)"
    )
    if e.step_s is not None and e.run_s is not None:
        hours = e.gpus * e.run_s / 3600
        head += (
            f": about {_duration(e.step_s)} a step, {_duration(e.run_s)} for trainer.steps={t.steps} "
            f"({hours:,.{1 if hours < 10 else 0}f} GPU-hours on {e.gpus:g} GPUs)"
        )
    else:
        head += ": per step not estimated"
    join = (
        "the larger of the two (async.max_staleness >= 1: the samplers generate during the update)"
        if e.overlapped
        else "the sum of the two (async.max_staleness=0: generation waits for the update)"
    )
    return (
        f"{head}\n  generation: {gen}\n  update: {upd}\n  a step: {join}; not counted: the weight push (no "
        "GPU-to-GPU figure recorded), checkpoints, held-out evaluation, start-up (download, vLLM and DeepSpeed)"
    )
