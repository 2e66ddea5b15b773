"""The longest sampler call a run expects, against the collective weight update's bound (`--dry-run` prints it).

A sampler joins a collective weight update only after its current `generate` returns, so
`async.weight_timeout_s` must outlast the longest call: `samplers.requests_per_call` x K x
`model.max_response_len` generated tokens.
"""

from __future__ import annotations

import math

from exgrpo.core.config import Config

# The one GPU generation rate recorded here (docs/benchmarks.md, "GPU learner and HF generate": HF generate on
# one H200, 1.5B shape, 64 rows, 790 tokens/s). vLLM on a GPU has not been measured here; it batches more rows
# per step and should be faster, so a call's time estimated at this rate is conservative (long) - what a timeout
# must cover.
ASSUMED_GPU_TOKENS_PER_S = 790.0

# torch's default timeout of a collective (NCCL's watchdog aborts the rank past it)
TORCH_COLLECTIVE_TIMEOUT_S = 600.0
# beyond rank 0's two weight bounds: its own gathers of the model and the slack of a busy host
COLLECTIVE_MARGIN_S = 120.0


def collective_timeout_s(cfg: Config) -> float:
    """The learner group's collective timeout (`learners.collective_timeout_s`, else derived): the other ranks
    wait in a collective while rank 0 pushes weights (ZeRO-3's per-layer gathers; ZeRO-2 with
    `async.overlap_update`: the next update's first all-reduce), and rank 0 may spend one
    `async.weight_timeout_s` opening a weight world and one sending; never below torch's default."""
    if cfg.learners.collective_timeout_s is not None:
        return cfg.learners.collective_timeout_s
    return max(TORCH_COLLECTIVE_TIMEOUT_S, 2 * cfg.async_.weight_timeout_s + COLLECTIVE_MARGIN_S)


def longest_call(cfg: Config) -> str:
    """The longest sampler call the run expects (`python -m exgrpo.run --dry-run`): its generated tokens, and
    for GPU samplers its time at ``ASSUMED_GPU_TOKENS_PER_S`` against async.weight_timeout_s, which a
    collective weight update must outlast (a sampler joins it only after its current call returns)."""
    s, a = cfg.samplers, cfg.async_
    k, length = cfg.trainer.rollouts_per_question, cfg.model.max_response_len
    tokens = s.requests_per_call * k * length
    line = (
        f"longest sampler call: samplers.requests_per_call={s.requests_per_call} x K={k} x "
        f"model.max_response_len={length} = {tokens} generated tokens"
    )
    if s.num_gpus == 0:
        return line + " (CPU samplers: no rate assumed)"
    seconds = tokens / ASSUMED_GPU_TOKENS_PER_S
    line += (
        f"; about {seconds:.0f} s at {ASSUMED_GPU_TOKENS_PER_S:.0f} tokens/s (the only GPU generation rate "
        "recorded, HF generate on an H200, docs/benchmarks.md; vLLM should be faster)"
    )
    if a.weight_sync != "collective":
        return line
    learners = (
        f"\n  learner collectives time out after {collective_timeout_s(cfg):g} s (learners.collective_timeout_s; "
        "null derives it: 2 x async.weight_timeout_s + 120 s, at least 600 s)"
    )
    if seconds <= a.weight_timeout_s:
        return line + f"; within async.weight_timeout_s={a.weight_timeout_s:g}" + learners
    fit = int(a.weight_timeout_s * ASSUMED_GPU_TOKENS_PER_S // (k * length))
    fixes = f"set async.weight_timeout_s={math.ceil(seconds / 100) * 100}"
    if fit >= 1:
        fixes += f" or samplers.requests_per_call={fit}"
    return (
        line + f"\n  warning: longer than async.weight_timeout_s={a.weight_timeout_s:g}: a collective weight "
        f"update waits for the call to end and would time out; {fixes}" + learners
    )
