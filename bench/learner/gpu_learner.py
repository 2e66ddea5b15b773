"""GPU benchmark: DeepSpeed learner update throughput and HF ``generate`` throughput on one device.

    python -m bench.learner.gpu_learner                  # Qwen2.5-1.5B-shaped random model, on the GPU
    .venv/bin/python -m bench.learner.gpu_learner --tiny # tiny shape on CPU (gloo, float32): checks the logic

Steps:
    1. a randomly initialised Qwen2 model (1.5B shape: hidden 1536, 28 layers, 12 heads, 2 KV heads,
       intermediate 8960, vocabulary 151936, tied embeddings) is saved as safetensors to a temp dir;
    2. HF ``generate`` with sampling on a batch of random prompts, every row forced to the full
       ``--gen-new`` tokens: generated tokens/s = batch * new tokens / wall time of one call;
    3. ``learners.learner.Learner`` (DeepSpeed ZeRO, world size 1) runs ``--warm`` + ``--timed`` updates on
       synthetic groups (half of them replay groups with slot 0 replayed): update tokens/s = response
       tokens trained / wall time of ``update`` (which includes the no-grad proximal log-prob pass);
    4. a JSON summary is printed and written to ``$OUT/gpu_learner.json`` (or ``--out``).

Peak memory is ``torch.cuda.max_memory_allocated`` since the stage's start (weights included).
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import tempfile
import time
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch

from bench.common import synchronize
from exgrpo.core import metric_names as M
from exgrpo.core.config import LearnerConfig, LossConfig
from exgrpo.core.records import Group, TrainBatch, Trajectory
from exgrpo.transport.ranks import free_port

GIB = 2**30


@dataclass(frozen=True)
class Shape:
    """Model and workload sizes of one benchmark run."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    groups: int  # questions per update
    rollouts: int  # K
    prompt_len: int
    response_len: int
    micro_batch: int
    gen_batch: int
    gen_prompt_len: int
    gen_new: int


FULL = Shape(1536, 28, 12, 2, 8960, 151936, 8, 8, 256, 1024, 4, 64, 256, 256)
TINY = Shape(64, 2, 4, 2, 128, 512, 2, 4, 8, 16, 4, 4, 8, 8)


@dataclass(frozen=True)
class GenerateResult:
    batch: int
    prompt_len: int
    new_tokens: int  # per row
    seconds: float
    tokens_per_s: float  # batch * new_tokens / seconds
    peak_mem_gib: float | None  # None on CPU


@dataclass(frozen=True)
class LearnerResult:
    zero_stage: int
    micro_batch: int
    rows_per_update: int
    response_tokens_per_update: int
    setup_s: float
    step_seconds: list[float]  # the timed steps
    tokens_per_s: float  # response tokens of the timed steps / their total wall time
    seq_tokens_per_s: float  # prompt + response tokens of the timed steps / their total wall time
    grad_norms: list[float]  # every step, warm-up included
    grad_norm_finite: bool
    skipped_steps: int
    peak_mem_gib: float | None  # over the timed steps; None on CPU


@dataclass(frozen=True)
class Summary:
    device: str
    torch: str
    transformers: str
    deepspeed: str
    dtype: str
    params: int
    shape: Shape
    generate: GenerateResult
    learner: LearnerResult


def peak_gib(device: torch.device) -> float | None:
    return torch.cuda.max_memory_allocated(device) / GIB if device.type == "cuda" else None


def reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def build_model(
    shape: Any,
    *,
    dtype: torch.dtype,
    device: torch.device,
    max_positions: int = 4096,
    tied: bool = True,
    rope_theta: float = 1_000_000.0,
) -> torch.nn.Module:
    """A randomly initialised Qwen2 causal LM of ``shape`` (its hidden, layers, heads, kv_heads, intermediate
    and vocab), built on ``device`` (a GPU initialises it in a second; the CPU takes minutes at a 7B shape)."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    config = Qwen2Config(
        hidden_size=shape.hidden,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        intermediate_size=shape.intermediate,
        vocab_size=shape.vocab,
        tie_word_embeddings=tied,
        max_position_embeddings=max(4096, max_positions),
        rope_theta=rope_theta,
        rms_norm_eps=1e-6,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    with device:
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    return model.eval()


@torch.no_grad()
def bench_generate(model: torch.nn.Module, shape: Shape, *, device: torch.device) -> GenerateResult:
    """One warm-up call (8 tokens), then one timed sampling call of ``gen_new`` tokens per row."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, shape.vocab, (shape.gen_batch, shape.gen_prompt_len), generator=g).to(device)
    mask = torch.ones_like(ids)
    kwargs = dict(do_sample=True, temperature=1.0, top_p=1.0, top_k=0, pad_token_id=0)
    model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=8, min_new_tokens=8, **kwargs)
    synchronize(device)
    reset_peak(device)
    start = time.perf_counter()
    out = model.generate(
        input_ids=ids,
        attention_mask=mask,
        max_new_tokens=shape.gen_new,
        min_new_tokens=shape.gen_new,
        **kwargs,
    )
    synchronize(device)
    seconds = time.perf_counter() - start
    new = out.shape[1] - shape.gen_prompt_len
    return GenerateResult(
        batch=shape.gen_batch,
        prompt_len=shape.gen_prompt_len,
        new_tokens=new,
        seconds=seconds,
        tokens_per_s=shape.gen_batch * new / seconds,
        peak_mem_gib=peak_gib(device),
    )


def synthetic_groups(shape: Shape, *, step: int) -> list[Group]:
    """``groups`` groups of ``rollouts`` full-length rollouts with random tokens and 0/1 rewards.

    Odd-numbered groups are replay groups whose slot 0 is a replayed trajectory; its stored behaviour
    log-prob is -ln(vocab), about what a random model gives, so the replay ratio starts near 1.
    """
    rng = np.random.default_rng(step)
    behaviour = -math.log(shape.vocab)
    out = []
    for q in range(shape.groups):
        qid = f"s{step}q{q}"
        replay = q % 2 == 1
        rewards = rng.integers(0, 2, size=shape.rollouts).astype(float)
        rewards[0], rewards[1] = 1.0, 0.0  # non-zero advantages in every group
        trajs = tuple(
            Trajectory(
                qid=qid,
                response_ids=tuple(rng.integers(1, shape.vocab, size=shape.response_len).tolist()),
                logprobs=(behaviour,) * shape.response_len,
                reward=float(rewards[i]),
                policy_version=step,
                replayed=replay and i == 0,
            )
            for i in range(shape.rollouts)
        )
        prompt = tuple(rng.integers(1, shape.vocab, size=shape.prompt_len).tolist())
        out.append(Group(qid, prompt, trajs, kind="replay" if replay else "fresh", policy_version=step))
    return out


def timed_updates(
    learner: Any,
    shape: Shape,
    dev: torch.device,
    *,
    warm: int,
    timed: int,
    deadline: float = math.inf,
    response_tokens: int,
) -> tuple[list[float], list[float], list[float], int]:
    """``warm`` + ``timed`` ``learner.update`` calls on ``synthetic_groups`` (no clipping: replay has started),
    each between device synchronisations: the timed ones' seconds, every update's grad norm and loss, and the
    skipped optimiser steps; stops timing at ``deadline`` (time.monotonic) once one was timed. The one update
    loop of this script and of the device check's learner part (``bench.learner.device_learner``)."""
    times: list[float] = []
    norms: list[float] = []
    losses: list[float] = []
    skipped = 0
    for step in range(warm + timed):
        if step >= warm and times and time.monotonic() > deadline:
            print(f"[learner] deadline: stopping after {len(times)} timed updates", flush=True)
            break
        groups = synthetic_groups(shape, step=step)
        if step == warm:
            reset_peak(dev)
        synchronize(dev)
        s0 = time.perf_counter()
        m = learner.update(TrainBatch(groups=tuple(groups), version=step, clip=False)).metrics
        synchronize(dev)
        seconds = time.perf_counter() - s0
        if int(m[M.LEARNER_TOKENS]) != response_tokens:
            raise RuntimeError(f"trained {m[M.LEARNER_TOKENS]} response tokens, expected {response_tokens}")
        norms.append(float(m[M.GRAD_NORM]))
        losses.append(float(m[M.LOSS]))
        skipped += int(m[M.SKIPPED_STEPS])
        if step >= warm:
            times.append(seconds)
        print(
            f"[learner] update {step}{'' if step >= warm else ' (warm-up)'}: {seconds:.3f} s, "
            f"grad norm {norms[-1]:.4g}, loss {losses[-1]:.4g}",
            flush=True,
        )
    return times, norms, losses, skipped


def bench_learner(
    model_path: str, shape: Shape, *, zero_stage: int, dtype: str, device: torch.device, warm: int, timed: int
) -> LearnerResult:
    """``warm`` + ``timed`` updates of the DeepSpeed learner at world size 1 (no clipping: replay has started)."""
    # imported here, not at the top: bench/learner/device_check.py imports this module where Ray and DeepSpeed
    # are missing
    from learners.learner import Learner

    cfg = LearnerConfig(
        zero_stage=zero_stage,
        backend="nccl" if device.type == "cuda" else "gloo",
        micro_batch_size=shape.micro_batch,
        num_gpus=1.0 if device.type == "cuda" else 0.0,
    )
    learner = Learner(
        model_path=model_path,
        learner=cfg,
        loss=LossConfig(),
        max_response_len=shape.response_len,
        master_port=free_port(),
        dtype=dtype,
    )
    start = time.perf_counter()
    learner.setup()
    setup_s = time.perf_counter() - start
    rows = shape.groups * shape.rollouts
    tokens = rows * shape.response_len
    times, norms, _, skipped = timed_updates(
        learner, shape, device, warm=warm, timed=timed, response_tokens=tokens
    )
    peak = peak_gib(device)
    total = sum(times)
    result = LearnerResult(
        zero_stage=zero_stage,
        micro_batch=shape.micro_batch,
        rows_per_update=rows,
        response_tokens_per_update=tokens,
        setup_s=setup_s,
        step_seconds=times,
        tokens_per_s=timed * tokens / total,
        seq_tokens_per_s=timed * rows * (shape.prompt_len + shape.response_len) / total,
        grad_norms=norms,
        grad_norm_finite=all(math.isfinite(n) for n in norms),
        skipped_steps=skipped,
        peak_mem_gib=peak,
    )
    del learner
    return result


def main(argv: list[str] | None = None) -> Summary:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tiny", action="store_true", help="tiny shape on CPU, float32 (logic check)")
    parser.add_argument("--zero", type=int, default=2, choices=[0, 1, 2, 3], help="DeepSpeed ZeRO stage")
    parser.add_argument("--warm", type=int, default=3, help="untimed warm-up updates")
    parser.add_argument("--timed", type=int, default=5, help="timed updates")
    parser.add_argument("--micro-batch", type=int, default=None, help="sequences per forward/backward")
    parser.add_argument("--out", default=None, help="JSON path (default $OUT/gpu_learner.json)")
    args = parser.parse_args(argv)

    torch.set_num_threads(1)
    shape = TINY if args.tiny else FULL
    if args.micro_batch is not None:
        shape = Shape(**{**asdict(shape), "micro_batch": args.micro_batch})
    device = torch.device("cpu") if args.tiny or not torch.cuda.is_available() else torch.device("cuda", 0)
    dtype = "float32" if device.type == "cpu" else "bfloat16"
    torch.manual_seed(0)

    import deepspeed
    import transformers

    with tempfile.TemporaryDirectory(prefix="exgrpo-gpu-bench-") as tmp:
        t0 = time.perf_counter()
        model = build_model(shape, dtype=getattr(torch, dtype), device=device)
        params = sum(p.numel() for p in model.parameters())  # tied embedding counted once
        model.save_pretrained(tmp)
        print(
            f"model: {params / 1e9:.3f} B params, built and saved in {time.perf_counter() - t0:.1f} s",
            flush=True,
        )
        gen = bench_generate(model, shape, device=device)
        print(f"generate: {gen}", flush=True)
        del model
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
        learn = bench_learner(
            tmp, shape, zero_stage=args.zero, dtype=dtype, device=device, warm=args.warm, timed=args.timed
        )
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    summary = Summary(
        device=torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        torch=torch.__version__,
        transformers=transformers.__version__,
        deepspeed=deepspeed.__version__,
        dtype=dtype,
        params=params,
        shape=shape,
        generate=gen,
        learner=learn,
    )
    text = json.dumps(asdict(summary), indent=1)
    print(text, flush=True)
    out = args.out or os.path.join(os.environ.get("OUT", "."), "gpu_learner.json")
    with open(out, "w") as f:
        f.write(text + "\n")
    return summary


if __name__ == "__main__":
    main()
