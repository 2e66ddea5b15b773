"""What a float32 model computes in on a CPU: bfloat16 autocast where the CPU has the instructions
(`learners.autocast`: off | auto | bfloat16). Used by the learner ranks (`learners/modeling.py`) and the cold
start (`exgrpo/models/cold_start.py`); reads /proc/cpuinfo, imports no torch. Tests: tests/learners/test_autocast.py.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")  # /proc/cpuinfo flags of CPUs with bfloat16 matmul instructions


def cpu_bf16_flags(cpuinfo: str = "/proc/cpuinfo") -> list[str]:
    """The ``BF16_CPU_FLAGS`` this CPU reports ([] where /proc/cpuinfo is missing: not Linux)."""
    try:
        with open(cpuinfo) as f:
            flags = {word for line in f if line.startswith("flags") for word in line.split()}
    except OSError:
        return []
    return [flag for flag in BF16_CPU_FLAGS if flag in flags]


def autocast_choice(
    setting: str, *, device: torch.device, dtype: str, chunked: bool = True
) -> tuple[bool, str]:
    """(whether the learner runs under CPU bfloat16 autocast, the sentence that says so and why) for
    ``learners.autocast`` on this rank's device with ``model.dtype`` weights. ``bfloat16`` on a CPU without the
    instructions still runs (slowly: emulated), which the sentence says."""
    if setting == "off":
        return False, "float32 (learners.autocast=off)" if dtype == "float32" else dtype
    if device.type != "cpu" or dtype != "float32":
        return False, f"{dtype} on {device.type} (learners.autocast applies to float32 CPU learners only)"
    flags = cpu_bf16_flags()
    if setting == "auto" and not flags:
        return False, "float32 (learners.autocast=auto: this CPU has no avx512_bf16 or amx_bf16)"
    why = (
        f"this CPU has {' and '.join(flags)}" if flags else "this CPU has no bfloat16 instructions: emulated"
    )
    # the chunked log-prob path runs lm_head outside the autocast; the full-logits path (logits_chunk_tokens null)
    # runs it inside the model's forward, under it
    head = "lm_head and loss in float32" if chunked else "loss in float32, lm_head in bfloat16"
    return True, f"bfloat16 autocast, {head} ({why})"
