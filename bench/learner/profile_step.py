"""One training step of the SmolLM2-135M CPU recipe, part by part, beside this machine's measured matmul floor.

    .venv/bin/python -m bench.learner.profile_step [--config configs/smollm2-135m-cpu.yaml] [--no-sampler]
        [--variants "learners.pack_prompts=off;learners.pack_prompts=auto"] [section.key=value ...]

Floor: one-thread float32/bfloat16 matmul GFLOP/s at the model's shapes. Learner (one spawned process per variant):
the second `Learner.update` timed, a third under torch.profiler bucketed into parts; the entropy pass and
`weight_sums` alone. Sampler: the production vLLM `Sampler` on the same B x K (bench_smollm2.run_engine)."""

from __future__ import annotations

import argparse
import json
import random
import time
from collections import defaultdict
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.common import env_defaults, in_child, stopwatch

env_defaults(ray=True, vllm_cpu=True, tokenizers=True, torch_extensions=True)

import torch  # noqa: E402

from bench.models.bench_smollm2 import in_process_learner, model_dir, run_engine  # noqa: E402
from exgrpo.core.config import Config  # noqa: E402
from exgrpo.core.config_files import load_config  # noqa: E402
from exgrpo.core.records import Group, ReplayCandidate, TrainBatch, Trajectory  # noqa: E402

PARTS = ("matmuls", "attention", "elementwise", "casts/copies", "softmax", "optimizer", "other")
MATMULS = {"mm", "addmm", "bmm", "baddbmm", "matmul", "linear", "mv", "addmv", "dot"}
FLOP_OPS = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm"}  # where the profiler counts FLOPs
ELEMENTWISE = {
    "mul", "add", "sub", "div", "silu", "silu_backward", "sigmoid", "exp", "log", "pow", "neg", "rsqrt", "sqrt",
    "mean", "sum", "clamp", "clamp_min", "clamp_max", "where", "maximum", "minimum", "abs", "tanh", "lerp",
    "addcmul", "addcdiv", "fill", "zero", "masked_fill", "threshold_backward", "reciprocal", "square", "rsub",
    "cos", "sin", "max", "min", "amax", "norm", "linalg_vector_norm", "_foreach_mul", "_foreach_add",
}  # fmt: skip
CASTS = {"to", "_to_copy", "copy", "clone", "contiguous"}
OPTIMIZER_MARK = "bench: optimizer step"  # the record_function around DeepSpeed's engine.step
CPU_FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16")


@dataclass(frozen=True)
class Shape:
    """(tokens x k) @ (k x n): `per_token` such matmuls in one token's forward."""

    name: str
    k: int
    n: int
    per_token: int
    head: bool = False  # lm_head: on response positions only

    @property
    def params(self) -> int:
        return self.k * self.n * self.per_token


def model_shapes(path: str | Path) -> list[Shape]:
    """The forward's matmul shapes of a Llama/Qwen2-style model, from its config.json."""
    c = json.loads((Path(path) / "config.json").read_text())
    h, inner, layers = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"]
    kv = c["num_key_value_heads"] * (c.get("head_dim") or h // c["num_attention_heads"])
    return [
        Shape("attn q,o", h, h, 2 * layers),
        Shape("attn k,v", h, kv, 2 * layers),
        Shape("mlp gate,up", h, inner, 2 * layers),
        Shape("mlp down", inner, h, layers),
        Shape("lm_head", h, c["vocab_size"], 1, head=True),
    ]


def cpu_flags(cpuinfo: str = "/proc/cpuinfo") -> dict[str, bool]:
    text = Path(cpuinfo).read_text() if Path(cpuinfo).exists() else ""  # not Linux: no flags
    words = {w for line in text.splitlines() if line.startswith("flags") for w in line.split()}
    return {flag: flag in words for flag in CPU_FLAGS}


def matmul_rate(m: int, shape: Shape, dtype: Any, *, min_s: float, least: int = 3) -> tuple[float, float]:
    """(GFLOP/s of the fastest call, seconds of the first) of (m x k) @ (k x n) on this thread: a warm-up call,
    then calls for min_s (at least `least`); the fastest is the floor on a machine other processes share."""
    a, b = torch.randn(m, shape.k).to(dtype), torch.randn(shape.k, shape.n).to(dtype)
    with stopwatch() as first:
        torch.mm(a, b)
    calls: list[float] = []
    while len(calls) < least or sum(calls) < min_s:
        with stopwatch() as t:
            torch.mm(a, b)
        calls.append(t.s)
    return 2 * m * shape.k * shape.n / min(calls) / 1e9, first.s


def floor(shapes: list[Shape], *, tokens: int, bf16_tokens: int, cap_s: float, min_s: float = 1.0) -> dict:
    """One-thread matmul GFLOP/s per shape: float32 at `tokens` rows; bfloat16 at `tokens` where the CPU has
    bf16 units, else (emulated) at `bf16_tokens`, each shape skipped (None) once one call would pass `cap_s`."""
    from exgrpo.core.precision import cpu_bf16_flags

    torch.set_num_threads(1)
    native = bool(cpu_bf16_flags())
    m = tokens if native else bf16_tokens
    out: dict[str, Any] = {"native_bf16": native, "tokens": tokens, "bf16_tokens": m}
    out["float32"] = {s.name: matmul_rate(tokens, s, torch.float32, min_s=min_s)[0] for s in shapes}
    rates: dict[str, float | None] = {}
    stop, slowest = False, 0.0  # emulated: stop after a call past the cap; the slowest rate predicts the next
    for s in shapes:
        if not native and (stop or (slowest and 2 * m * s.k * s.n / (slowest * 1e9) > cap_s)):
            rates[s.name] = None
            continue
        rate, first_s = matmul_rate(m, s, torch.bfloat16, min_s=min_s * native, least=3 if native else 1)
        rates[s.name], stop = rate, first_s > cap_s
        slowest = min(slowest or rate, rate)
    out["bfloat16"] = rates
    return out


def model_rate(shapes: list[Shape], rates: dict[str, float | None]) -> float | None:
    """GFLOP/s of one token's forward matmuls at the per-shape rates (FLOP-weighted harmonic mean)."""
    if any(rates.get(s.name) is None for s in shapes):
        return None
    return sum(s.params for s in shapes) / sum(s.params / float(rates[s.name] or 0) for s in shapes)


def synthetic_groups(
    *, b: int, k: int, prompt_len: int, max_len: int, vocab: int, rho: float, seed: int = 0
) -> tuple[tuple[Group, ...], list[ReplayCandidate]]:
    """B groups of K rollouts (lengths max_len/4..max_len, mixed rewards); the first floor(rho B) are replay
    groups (slot 0 replayed), whose 4 stored candidates each are the entropy pass's input."""
    rng = random.Random(seed)
    lo, hi = min(vocab - 1, 3), vocab - 1

    def traj(qid: str, i: int, replayed: bool = False) -> Trajectory:
        n = rng.randint(max(1, max_len // 4), max_len)
        ids = tuple(rng.randint(lo, hi) for _ in range(n))
        return Trajectory(qid, ids, (-2.0,) * n, float(i % 3 == 0 or replayed), 0, replayed=replayed)

    groups, candidates = [], []
    for q in range(b):
        qid, replay = f"q{q}", q < int(rho * b)
        prompt = tuple(rng.randint(lo, hi) for _ in range(prompt_len))
        trajs = tuple(traj(qid, i, replayed=replay and i == 0) for i in range(k))
        groups.append(Group(qid, prompt, trajs, kind="replay" if replay else "fresh", request_id=q))
        if replay:
            candidates += [ReplayCandidate(qid, prompt, traj(qid, 0, True)) for _ in range(4)]
    return tuple(groups), candidates


def part_of(event: Any) -> str:
    """The part a profiler event's self time goes to: under the optimizer step or attention by its ancestors,
    else by its own aten name (autograd nodes and annotations: other)."""
    node = event
    while node is not None:
        name = node.name
        if name == OPTIMIZER_MARK:
            return "optimizer"
        if "scaled_dot_product" in name or "attention" in name.lower():
            return "attention"
        node = node.cpu_parent
    if not event.name.startswith("aten::"):
        return "other"
    op = event.name[len("aten::") :]
    base = op.rstrip("_")
    if "softmax" in op:
        return "softmax"
    if base in MATMULS:
        return "matmuls"
    if base in CASTS:
        return "casts/copies"
    if base in ELEMENTWISE or base.removesuffix("_backward") in ELEMENTWISE:
        return "elementwise"
    return "other"


def bucket(events: Any) -> dict[str, Any]:
    """Self CPU seconds per part, the events' total (their roots' CPU time), matmul FLOPs, each part's largest
    ops."""
    parts, total, flops = dict.fromkeys(PARTS, 0.0), 0.0, 0
    ops: dict[tuple[str, str], float] = defaultdict(float)
    for e in events:
        if e.cpu_parent is None:
            total += e.cpu_time_total / 1e6
        part = part_of(e)
        parts[part] += e.self_cpu_time_total / 1e6
        ops[part, e.name] += e.self_cpu_time_total / 1e6
        if e.name in FLOP_OPS:
            flops += int(e.flops or 0)
    largest = {
        p: sorted(((n, t) for (q, n), t in ops.items() if q == p), key=lambda nt: -nt[1])[:3] for p in PARTS
    }
    return {"parts": parts, "ops_s": total, "flops": flops, "largest": largest}


def mark_optimizer_step(learner: Any) -> None:
    """Wrap the DeepSpeed engine's step in a record_function, so the profile sees the optimizer's ops."""
    from torch.profiler import record_function

    step = learner.engine.step

    def marked(*args: Any, **kwargs: Any) -> Any:
        with record_function(OPTIMIZER_MARK):
            return step(*args, **kwargs)

    learner.engine.step = marked


def profile_learner(path: str | Path, groups: tuple[Group, ...], candidates: list, *, cfg: Config) -> dict:
    """A production learner (world size 1) on `groups`: setup, two updates (the second timed), a third under
    torch.profiler (bucketed), then the entropy pass on `candidates` and `weight_sums`, each timed on a second
    call."""
    from torch.profiler import ProfilerActivity, profile

    learner = in_process_learner(path, cfg=cfg)
    with stopwatch() as setup:
        compute = learner.setup()
    mark_optimizer_step(learner)
    walls, cpus, prof = [], [], profile(activities=[ProfilerActivity.CPU], with_flops=True)
    for version in range(3):  # the second timed, the third under the profiler
        profiling: Any = prof if version == 2 else nullcontext()
        start = time.process_time()
        with profiling, stopwatch() as t:
            metrics = learner.update(TrainBatch(groups=groups, version=version, clip=True)).metrics
        walls.append(t.s)
        cpus.append(time.process_time() - start)
    result = bucket(prof.events())
    extra = {}
    for name, call in (
        ("entropy_s", lambda: learner.entropies(candidates=candidates)),
        ("weight_sums_s", learner.weight_sums),
    ):
        for _ in range(2):
            with stopwatch() as t:
                call()
        extra[name] = t.s
    return {
        **result,
        **extra,
        "compute": compute,
        "setup_s": setup.s,
        **dict(zip(("first_s", "update_s", "profiled_s"), walls, strict=True)),
        **dict(zip(("first_cpu_s", "update_cpu_s", "profiled_cpu_s"), cpus, strict=True)),
        "tokens": metrics.get("learner/tokens", 0.0),
        "threads": torch.get_num_threads(),
        "lora": cfg.learners.lora_rank > 0,
    }


def print_floor(fl: dict, shapes: list[Shape], flags: dict[str, bool]) -> tuple[float, float | None]:
    """Print the floor table; returns (float32, bfloat16 or None) GFLOP/s of the model's matmul mix."""
    print(
        f"cpu: {torch.backends.cpu.get_cpu_capability()}; flags "
        + ", ".join(f"{f} {'yes' if v else 'no'}" for f, v in flags.items())
    )
    kind = "native" if fl["native_bf16"] else "emulated (no avx512_bf16/amx_bf16)"
    print(f"floor, 1 thread: float32 at {fl['tokens']} tokens, bfloat16 {kind} at {fl['bf16_tokens']} tokens")
    print(f"  {'shape':14}{'k x n':>14}{'fp32 GFLOP/s':>14}{'bf16 GFLOP/s':>14}")
    for s in shapes:
        bf = fl["bfloat16"][s.name]
        bf_text = f"{bf:14.1f}" if bf is not None else f"{'over cap':>14}"
        print(f"  {s.name:14}{f'{s.k} x {s.n}':>14}{fl['float32'][s.name]:14.1f}{bf_text}")
    fp32, bf16 = model_rate(shapes, fl["float32"]), model_rate(shapes, fl["bfloat16"])
    assert fp32 is not None
    bf_line = (
        f"{bf16:.1f} GFLOP/s" + ("" if fl["native_bf16"] else " (emulated)")
        if bf16
        else "n/a (shapes over the cap)"
    )
    print(f"  the model's matmul mix: float32 {fp32:.1f} GFLOP/s, bfloat16 {bf_line}")
    return fp32, bf16 if fl["native_bf16"] else None


def min_flops(shapes: list[Shape], groups: tuple[Group, ...], *, lora: bool) -> float:
    """Matmul FLOPs of the update with each prompt computed once and no padding: forward, activation gradients,
    and weight gradients unless LoRA (whose adapters' FLOPs are left out)."""
    responses = sum(len(t.response_ids) for g in groups for t in g.trajectories)
    body = sum(s.params for s in shapes if not s.head) * (sum(len(g.prompt_ids) for g in groups) + responses)
    head = sum(s.params for s in shapes if s.head) * responses
    return 2.0 * (body + head) * (2 if lora else 3)


def report(label: str, r: dict, *, fp32: float, bf16: float | None, minimum: float, candidates: int) -> str:
    """Print one variant's profile; returns its summary line."""
    print(f"\nlearner [{label}]: {r['compute']}; {r['threads']} thread(s)")
    print(
        f"  setup {r['setup_s']:.1f} s; update 1 {r['first_s']:.2f} s, update 2 (timed) {r['update_s']:.2f} s "
        f"(CPU {r['update_cpu_s'] / r['update_s']:.0%} of it) on {int(r['tokens'])} response tokens; update 3 under "
        f"the profiler {r['profiled_s']:.2f} s (CPU {r['profiled_cpu_s'] / r['profiled_s']:.0%}; under 100%: other "
        "processes had the core part of the time)"
    )
    outside = max(0.0, r["profiled_s"] - r["ops_s"])
    rows = [*r["parts"].items(), ("outside ops", outside)]
    print(
        f"  {'part':16}{'seconds':>9}{'share':>8}   largest ops (self CPU time of the profiled update's ops)"
    )
    for part, t in rows:
        names = ", ".join(f"{n.removeprefix('aten::')} {s:.2f}" for n, s in r["largest"].get(part, []))
        print(f"  {part:16}{t:9.2f}{t / r['profiled_s']:8.1%}   {names}".rstrip())
    gflop, achieved = r["flops"] / 1e9, r["flops"] / 1e9 / r["update_s"]
    mm_rate = gflop / r["parts"]["matmuls"] if r["parts"]["matmuls"] else 0.0
    useful = minimum / 1e9 / r["update_s"]
    print(
        f"  matmul FLOPs: {gflop:.1f} G counted by the profiler, {minimum / 1e9:.1f} G with each prompt once and no "
        f"padding; over the timed update {achieved:.2f} GFLOP/s counted = {achieved / fp32:.1%} of the float32 floor "
        f"({fp32:.1f}), {useful:.2f} GFLOP/s useful = {useful / fp32:.1%}; the matmul ops alone {mm_rate:.1f} "
        f"GFLOP/s = {mm_rate / fp32:.0%}"
        + (f"; {achieved / bf16:.1%} of the bfloat16 floor ({bf16:.1f})" if bf16 else "")
    )
    print(
        f"  extra passes: entropy of {candidates} replay candidates {r['entropy_s']:.2f} s; weight_sums "
        f"{r['weight_sums_s']:.3f} s"
    )
    top = max(rows, key=lambda kv: kv[1])
    return (
        f"summary [{label}]: update {r['update_s']:.2f} s, {achieved / fp32:.1%} of the float32 floor counted "
        f"({useful / fp32:.1%} useful), biggest part {top[0]} ({top[1] / r['profiled_s']:.0%})"
    )


def print_sampler(cfg: Config, path: Path, fp32: float, shapes: list[Shape]) -> None:
    """Generation of B x K with the production Sampler in a child process, beside its float32 floor."""
    from exgrpo.data.sources import read_source

    b = cfg.trainer.questions_per_step
    prompts = list(read_source(cfg.data.train, split="train", num=b, seed=cfg.data.seed).prompts[:b])
    e = in_child(run_engine, cfg.samplers.engine, path, prompts, cfg=cfg)
    floor_s = e.tokens * 2 * sum(s.params for s in shapes) / (fp32 * 1e9)
    print(
        f"\nsampler ({e.engine}, {e.threads} thread(s)): generation {e.gen_s:.2f} s for {e.tokens} tokens "
        f"({e.tokens_per_s:.1f} tokens/s, {e.tokens / e.rollouts:.1f} a rollout), verification {e.verify_s:.3f} s; "
        f"floor (generated tokens x 2 x {sum(s.params for s in shapes) / 1e6:.1f} M matmul parameters at "
        f"{fp32:.1f} GFLOP/s) {floor_s:.2f} s = {floor_s / e.gen_s:.1%} of the generation time"
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default="configs/smollm2-135m-cpu.yaml")
    parser.add_argument(
        "--sampler", action=argparse.BooleanOptionalAction, default=True, help="profile generation too"
    )
    parser.add_argument(
        "--variants",
        default="",
        help="learner settings profiled side by side, one per ';', each a '+'-joined list of overrides "
        "(learners.pack_prompts=off;learners.pack_prompts=auto); default: the config's own",
    )
    parser.add_argument("--prompt-tokens", type=int, default=40, help="synthetic prompt length")
    parser.add_argument("--floor-tokens", type=int, default=512, help="rows of the float32 floor's matmuls")
    parser.add_argument("--bf16-cap-s", type=float, default=2.0, help="longest emulated bfloat16 matmul call")
    parser.add_argument("overrides", nargs="*", help="config overrides (section.key=value)")
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    cfg = load_config(args.config, args.overrides)
    path = model_dir(cfg)
    shapes = model_shapes(path)
    fl = floor(shapes, tokens=args.floor_tokens, bf16_tokens=64, cap_s=args.bf16_cap_s)
    fp32, bf16 = print_floor(fl, shapes, cpu_flags())
    b, k, r = cfg.trainer.questions_per_step, cfg.trainer.rollouts_per_question, cfg.model.max_response_len
    groups, candidates = synthetic_groups(
        b=b, k=k, prompt_len=args.prompt_tokens, max_len=r, vocab=shapes[-1].n, rho=cfg.replay.rho
    )
    responses = [len(t.response_ids) for g in groups for t in g.trajectories]
    print(
        f"\nbatch: B={b} K={k}, synthetic prompts of {args.prompt_tokens} tokens, responses {min(responses)}-"
        f"{max(responses)} tokens ({sum(responses)} in all), {sum(g.kind == 'replay' for g in groups)} replay groups"
    )
    if args.sampler:
        print_sampler(cfg, path, fp32, shapes)
    summaries = []
    for variant in args.variants.split(";") if args.variants else [""]:
        extra = [o for o in variant.split("+") if o]
        vcfg = load_config(args.config, [*args.overrides, *extra])
        result = in_child(profile_learner, path, groups, candidates, cfg=vcfg)
        minimum = min_flops(shapes, groups, lora=result["lora"])
        label = " ".join(extra) or "as configured"
        summaries.append(
            report(label, result, fp32=fp32, bf16=bf16, minimum=minimum, candidates=len(candidates))
        )
    print("\n" + "\n".join(summaries))


if __name__ == "__main__":
    main()
