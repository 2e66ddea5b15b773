"""Learner throughput on one device: the project's ``learners.learner.Learner`` (DeepSpeed at world size 1, the
1.5B recipe's learner section) timed on synthetic groups of a random Qwen2 model, beside HF ``generate``.

    python -m bench.learner.gpu_learner                   # Qwen2.5-1.5B shape on the GPU, bf16
    .venv/bin/python -m bench.learner.gpu_learner --tiny  # tiny shape on CPU (gloo, float32): checks the logic

``check_learner`` is also the device check's learner part; ``Shape``, ``build_model`` and ``synthetic_groups``
are the model and workload its other parts share (docs/benchmarks.md: what each figure counts).
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bench.common import synchronize
from bench.learner.device_shapes import one_rank, peak, reset_peak, setup_device, start_learner
from exgrpo.core import metric_names as M
from exgrpo.core.config import Config, from_dict
from exgrpo.core.records import Group, TrainBatch, Trajectory
from exgrpo.runtime.memory_plan import GIB, learner_peak, learner_terms, read_shape


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


def peak_gib(device: torch.device) -> float | None:
    """``max_memory_allocated`` in GiB since the last ``reset_peak``; None on CPU (no allocator statistics)."""
    return peak(device) / GIB if device.type == "cuda" else None


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
    loop of this module's learner timing (``check_learner``) and of the device check's other learner parts."""
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


PEAK_TFLOPS = 790.0  # bf16 dense, 8192^3 matmul measured on an H200
# the 1.5B shape at 8k tokens per sequence: 2 groups x 8 rollouts of 512 prompt + 7680 response tokens
GPU_SHAPE = replace(FULL, groups=2, rollouts=8, prompt_len=512, response_len=7680, micro_batch=8)
SMOKE_SHAPE = TINY
RECIPE = Path(__file__).resolve().parents[2] / "configs" / "qwen2.5-math-1.5b.yaml"


def learner_config(
    shape: Shape, *, dtype: str, cuda: bool, checkpointing: bool, zero_stage: int | None = None
) -> Config:
    """The 1.5B recipe's learner and loss sections at one rank, with ``shape``'s sequence lengths (and
    ``zero_stage`` in place of the recipe's, when given)."""
    import yaml

    recipe = yaml.safe_load(RECIPE.read_text())
    learners = one_rank(
        recipe["learners"],
        cuda=cuda,
        micro_batch_size=shape.micro_batch,
        gradient_checkpointing="on" if checkpointing else "off",
    )
    if zero_stage is not None:
        learners["zero_stage"] = zero_stage
    model = {"dtype": dtype, "max_prompt_len": shape.prompt_len, "max_response_len": shape.response_len}
    return from_dict({"model": model, "learners": learners, "loss": recipe["loss"]})


def check_learner(
    *,
    shape: Shape,
    device: str,
    dtype: str,
    warm: int,
    timed: int,
    checkpointing: bool,
    peak_flops: float,
    deadline: float,
    zero_stage: int | None = None,
) -> dict[str, Any]:
    """``warm`` + ``timed`` ``Learner.update`` calls; stops timing early at ``deadline`` (time.monotonic)."""

    dev = setup_device(device)
    cuda = dev.type == "cuda"
    cfg = learner_config(shape, dtype=dtype, cuda=cuda, checkpointing=checkpointing, zero_stage=zero_stage)
    t0 = time.perf_counter()
    torch.manual_seed(0)
    seq = shape.prompt_len + shape.response_len
    with tempfile.TemporaryDirectory(prefix="exgrpo-device-model-") as model_dir:
        model = build_model(shape, dtype=getattr(torch, dtype), device=torch.device("cpu"), max_positions=seq)
        params = sum(p.numel() for p in model.parameters())  # the tied embedding once
        model.save_pretrained(model_dir)
        del model
        plan = learner_terms(cfg, read_shape(model_dir), on_gpu=cuda)
        learner = start_learner(cfg, model_dir, max_response_len=shape.response_len)  # in cfg.model.dtype
    setup_s = time.perf_counter() - t0
    engine_model = learner.engine.module
    rows = shape.groups * shape.rollouts
    tokens, response_tokens = rows * seq, rows * shape.response_len
    print(
        f"[learner] project Learner (DeepSpeed ZeRO-{cfg.learners.zero_stage}, {dtype}), "
        f"{params / 1e9:.3f} B params, {rows} x {seq} tokens per update, setup {setup_s:.1f} s",
        flush=True,
    )
    times, norms, losses, skipped = timed_updates(
        learner, shape, dev, warm=warm, timed=timed, deadline=deadline, response_tokens=response_tokens
    )
    if not times:
        raise RuntimeError("no timed update finished")
    t = sum(times) / len(times)
    model_flops = 6 * params * tokens
    attn_flops = 6 * shape.layers * shape.hidden * rows * seq * seq  # 3 (fwd+bwd) x 2 matmuls x 2 S^2 d / 2
    hw_flops = (8 + 2 * int(checkpointing)) * params * tokens
    peak = peak_gib(dev)
    predicted = learner_peak(plan) / GIB  # persistent terms + the largest phase
    out = {
        "device": torch.cuda.get_device_name(dev) if cuda else "cpu",
        "learner": f"learners.learner.Learner, DeepSpeed ZeRO-{cfg.learners.zero_stage}, world size 1",
        "dtype": dtype,
        "params": params,
        "shape": asdict(shape),
        "learner_config": asdict(cfg.learners),
        "rows_per_update": rows,
        "tokens_per_update": tokens,
        "response_tokens_per_update": response_tokens,
        "gradient_checkpointing": bool(engine_model.is_gradient_checkpointing and engine_model.training),
        "setup_s": setup_s,
        "step_seconds": times,
        "mean_step_s": t,
        "tokens_per_s": tokens / t,
        "response_tokens_per_s": response_tokens / t,
        "peak_flops": peak_flops,
        "model_flops_per_update": model_flops,
        "attention_flops_per_update": attn_flops,
        "mfu": model_flops / t / peak_flops,
        "mfu_with_attention": (model_flops + attn_flops) / t / peak_flops,
        "hfu": hw_flops / t / peak_flops,
        "grad_norms": norms,
        "losses": losses,
        "grad_norm_finite": all(math.isfinite(n) for n in norms),
        "skipped_steps": skipped,
        "peak_mem_gib": peak,
        "predicted_gib": predicted,
        "plan_terms_gib": {k: v / GIB for k, v in plan.items()},
        "peak_over_predicted": None if peak is None else peak / predicted,
    }
    print(
        f"[learner] {out['tokens_per_s']:.0f} tokens/s, MFU {out['mfu']:.3f} "
        f"(with attention {out['mfu_with_attention']:.3f}, HFU {out['hfu']:.3f}), {t:.3f} s per update, "
        f"peak memory {'n/a' if peak is None else format(peak, '.1f') + ' GiB'} "
        f"(the memory plan predicts {predicted:.1f} GiB)",
        flush=True,
    )
    os.environ.pop("MASTER_PORT", None)
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tiny", action="store_true", help="tiny shape on CPU, float32 (logic check)")
    parser.add_argument(
        "--zero",
        type=int,
        default=None,
        choices=[0, 1, 2, 3],
        help="DeepSpeed ZeRO stage (default: the recipe's, 2)",
    )
    parser.add_argument("--warm", type=int, default=3, help="untimed warm-up updates")
    parser.add_argument("--timed", type=int, default=5, help="timed updates")
    parser.add_argument("--micro-batch", type=int, default=None, help="sequences per forward/backward")
    parser.add_argument(
        "--no-checkpointing", action="store_true", help="gradient checkpointing off (the recipe has it on)"
    )
    parser.add_argument("--out", default=None, help="JSON path (default $OUT/gpu_learner.json)")
    args = parser.parse_args(argv)

    torch.set_num_threads(1)
    shape = TINY if args.tiny else FULL
    if args.micro_batch is not None:
        shape = replace(shape, micro_batch=args.micro_batch)
    device = torch.device("cpu") if args.tiny or not torch.cuda.is_available() else torch.device("cuda", 0)
    dtype = "float32" if device.type == "cpu" else "bfloat16"
    torch.manual_seed(0)

    import deepspeed
    import transformers

    t0 = time.perf_counter()
    model = build_model(shape, dtype=getattr(torch, dtype), device=device)
    print(f"model built in {time.perf_counter() - t0:.1f} s", flush=True)
    gen = bench_generate(model, shape, device=device)
    print(f"generate: {gen}", flush=True)
    del model
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    learn = check_learner(
        shape=shape,
        device=str(device),
        dtype=dtype,
        warm=args.warm,
        timed=args.timed,
        checkpointing=not args.no_checkpointing,
        peak_flops=PEAK_TFLOPS * 1e12,
        deadline=math.inf,
        zero_stage=args.zero,
    )
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    versions = {"torch": torch.__version__, "transformers": transformers.__version__}
    summary = {"device": learn["device"], **versions, "deepspeed": deepspeed.__version__, "dtype": dtype}
    summary |= {"params": learn["params"], "shape": asdict(shape), "generate": asdict(gen), "learner": learn}
    text = json.dumps(summary, indent=1)
    print(text, flush=True)
    out = args.out or os.path.join(os.environ.get("OUT", "."), "gpu_learner.json")
    with open(out, "w") as f:
        f.write(text + "\n")
    return summary


if __name__ == "__main__":
    main()
