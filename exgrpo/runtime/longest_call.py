"""The longest sampler call a run expects, against the collective weight update's bound (`--dry-run` prints it).

A sampler joins a collective weight update only after its current `generate` returns, so
`async.weight_timeout_s` must outlast the longest call: `samplers.requests_per_call` x K x
`model.max_response_len` generated tokens.
"""

from __future__ import annotations

import math

from exgrpo.core.config import Config

# The one GPU generation rate recorded here (docs/gpu.md, "Figures seen": HF generate on one H200, 1.5B shape,
# 64 rows, 790 tokens/s). vLLM on a GPU has not been measured here; it batches more rows per step and should
# be faster, so a call's time estimated at this rate is conservative (long) - what a timeout must cover.
ASSUMED_GPU_TOKENS_PER_S = 790.0


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
        "recorded, HF generate on an H200, docs/gpu.md; vLLM should be faster)"
    )
    if a.weight_sync != "collective":
        return line
    if seconds <= a.weight_timeout_s:
        return line + f"; within async.weight_timeout_s={a.weight_timeout_s:g}"
    fit = int(a.weight_timeout_s * ASSUMED_GPU_TOKENS_PER_S // (k * length))
    fixes = f"set async.weight_timeout_s={math.ceil(seconds / 100) * 100}"
    if fit >= 1:
        fixes += f" or samplers.requests_per_call={fit}"
    return (
        line + f"\n  warning: longer than async.weight_timeout_s={a.weight_timeout_s:g}: a collective weight "
        f"update waits for the call to end and would time out; {fixes}"
    )
