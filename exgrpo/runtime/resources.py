"""Resources checked before anything waits: the run's plan against the cluster's resources.

A placement group or actor that asks for more than the cluster has waits forever without a word, so
`check_cluster(cfg)` runs right after `ray.init` and again before the first actor, and fails at once with a
`ResourceError` naming what is missing and the settings that would fit. `plan_resources` (the plan) and
`shortfalls` (totals, largest node, first-fit packing) are pure; `EXGRPO_SKIP_RESOURCE_CHECK=1` skips the check.
More: docs/architecture.md ("Learner and driver death", the resources bullet); tests: tests/exgrpo/runtime/test_resources.py.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from exgrpo.core.config import Config, ConfigError
from exgrpo.core.names import CONTROLLER, learner_name, replay_name, sampler_name
from exgrpo.runtime.longest_call import longest_call
from exgrpo.runtime.step_time import step_time

log = logging.getLogger(__name__)

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")
GIB = 1024**3


class ResourceError(ConfigError):
    """The plan cannot be placed on this cluster; the message names what is missing and the fix."""


@dataclass(frozen=True)
class Demand:
    """`count` actors (or placement-group bundles) of one role, each asking for these resources."""

    role: str  # "sampler" | "learner"
    count: int
    num_cpus: float
    num_gpus: float
    memory_bytes: float = 0.0  # estimated resident memory of one (0 = unknown)


@dataclass(frozen=True)
class ResourcePlan:
    demands: tuple[Demand, ...]
    object_store_bytes: float = 0.0  # estimated object store need (0 = unknown)

    @property
    def cpus(self) -> float:
        return sum(d.count * d.num_cpus for d in self.demands)

    @property
    def gpus(self) -> float:
        return sum(d.count * d.num_gpus for d in self.demands)

    @property
    def memory_bytes(self) -> float:
        return sum(d.count * d.memory_bytes for d in self.demands)

    def breakdown(self, key: str) -> str:
        """'2 samplers x 1 + 1 learner x 1' for key 'num_cpus' or 'num_gpus'."""
        parts = [
            f"{d.count} {d.role}{'s' if d.count != 1 else ''} x {_num(getattr(d, key))}" for d in self.demands
        ]
        return " + ".join(parts)


def model_weight_bytes(model_path: str | Path | None) -> int:
    """Total size of the weight files in a model directory (0 when unknown)."""
    if not model_path:
        return 0
    p = Path(model_path)
    if not p.is_dir():
        return 0
    return sum(f.stat().st_size for f in p.iterdir() if f.is_file() and f.suffix in WEIGHT_SUFFIXES)


def sampler_bundles(*, num_cpus: float, num_gpus: float, tensor_parallel_size: int) -> list[dict[str, float]]:
    """The placement-group bundles of one tensor-parallel sampler: one {GPU: num_gpus} per rank (vLLM puts a
    worker on each bundle with a GPU and refuses bundles of more than one GPU), the actor's CPUs in the first."""
    bundles: list[dict[str, float]] = [{"GPU": float(num_gpus)} for _ in range(tensor_parallel_size)]
    if num_cpus > 0:
        bundles[0]["CPU"] = float(num_cpus)
    return bundles


def sampler_gpus(cfg: Config) -> float:
    """GPUs one sampler reserves: samplers.num_gpus for each of its tensor-parallel ranks."""
    return float(cfg.samplers.num_gpus) * cfg.samplers.tensor_parallel_size


def plan_resources(cfg: Config, *, model_bytes: int = 0) -> ResourcePlan:
    """The resources the run asks Ray for, and rough memory / object store needs.

    Memory (only when the model is known and lives in host memory): a learner holds the weights,
    their gradients and two AdamW moments (4x the weights in float32), a CPU sampler one copy.
    Object store: the object-store transport keeps up to `max_staleness + 1` exported versions.
    Activations, KV caches and the processes' own footprint are not counted.
    """
    s, lr = cfg.samplers, cfg.learners
    fp32 = model_bytes * (2 if cfg.model.dtype in ("bfloat16", "float16") else 1)
    learner_mem = 4.0 * fp32 if lr.num_gpus == 0 else 0.0
    sampler_mem = float(model_bytes) if s.num_gpus == 0 else 0.0
    demands = (
        Demand("sampler", s.num, float(s.num_cpus), sampler_gpus(cfg), sampler_mem),
        Demand("learner", lr.num, float(lr.num_cpus), float(lr.num_gpus), learner_mem),
    )
    store = (
        float(model_bytes) * (cfg.async_.max_staleness + 1)
        if cfg.async_.weight_sync == "object_store"
        else 0.0
    )
    return ResourcePlan(demands=demands, object_store_bytes=store)


def _num(x: float) -> str:
    return f"{x:g}"


def _floor2(x: float) -> float:
    return math.floor(x * 100 + 1e-9) / 100


def _cpu_fixes(cfg: Config, have: float, need: float) -> list[str]:
    s, lr = cfg.samplers, cfg.learners
    fixes = []
    free_for_samplers = have - lr.num * lr.num_cpus
    if free_for_samplers > 0:
        per = _floor2(free_for_samplers / s.num)
        if 0 < per < s.num_cpus:
            fixes.append(f"set samplers.num_cpus={_num(per)}")
        n = math.floor(free_for_samplers / s.num_cpus + 1e-9) if s.num_cpus > 0 else s.num
        if 1 <= n < s.num:
            fixes.append(f"set samplers.num={n}")
    free_for_learners = have - s.num * s.num_cpus
    if free_for_learners > 0:
        per = _floor2(free_for_learners / lr.num)
        if 0 < per < lr.num_cpus:
            fixes.append(f"set learners.num_cpus={_num(per)}")
    fixes.append(
        f"use a cluster with more CPUs (logical CPUs may exceed cores: `ray start --head --num-cpus="
        f"{math.ceil(need - 1e-9)}`)"
    )
    return fixes


def _gpu_fixes(cfg: Config, have: float, need: float) -> list[str]:
    s, lr = cfg.samplers, cfg.learners
    fixes = []
    if have == 0:
        fixes.append("set samplers.num_gpus=0 learners.num_gpus=0 (run on CPU)")
    else:
        free_for_samplers = have - lr.num * lr.num_gpus
        if free_for_samplers > 0 and s.num_gpus > 0:
            n = math.floor(free_for_samplers / sampler_gpus(cfg) + 1e-9)
            if 1 <= n < s.num:
                fixes.append(f"set samplers.num={n}")
            # whole GPUs only: a share of one puts two engines (and, with async.weight_sync=collective, two
            # NCCL ranks) on one device (exgrpo/core/config_checks.py refuses that)
            per = math.floor(free_for_samplers / (s.num * s.tensor_parallel_size) + 1e-9)
            if 1 <= per < s.num_gpus:
                fixes.append(f"set samplers.num_gpus={per}")
    fixes.append(f"use a cluster with {_num(math.ceil(need - 1e-9))} GPUs")
    return fixes


def _pack(items: Sequence[tuple[str, float, float]], nodes: Sequence[Mapping[str, float]]) -> str | None:
    """First-fit-decreasing of (name, cpus, gpus) onto nodes; the first item that fits nowhere, or None."""
    free = [[float(n.get("CPU", 0)), float(n.get("GPU", 0))] for n in nodes]
    for name, cpu, gpu in sorted(items, key=lambda it: (-it[2], -it[1])):
        for f in free:
            if f[0] + 1e-9 >= cpu and f[1] + 1e-9 >= gpu:
                f[0] -= cpu
                f[1] -= gpu
                break
        else:
            return name
    return None


def shortfalls(
    cfg: Config,
    plan: ResourcePlan,
    resources: Mapping[str, float],
    nodes: Sequence[Mapping[str, float]] = (),
    *,
    have: str = "the cluster has {n}",
) -> list[str]:
    """What the plan lacks on a cluster with these (total or free) resources; [] when it fits."""
    out = []
    have_cpu, have_gpu = float(resources.get("CPU", 0)), float(resources.get("GPU", 0))
    if plan.cpus > have_cpu + 1e-9:
        out.append(
            f"the plan needs {_num(plan.cpus)} CPUs ({plan.breakdown('num_cpus')}; replay shards and the "
            f"controller take 0) but {have.format(n=_num(have_cpu))}: "
            + ", or ".join(_cpu_fixes(cfg, have_cpu, plan.cpus))
        )
    if plan.gpus > have_gpu + 1e-9:
        out.append(
            f"the plan needs {_num(plan.gpus)} GPUs ({plan.breakdown('num_gpus')}) but "
            f"{have.format(n=_num(have_gpu))}: " + ", or ".join(_gpu_fixes(cfg, have_gpu, plan.gpus))
        )
    mem = float(resources.get("memory", 0))
    if plan.memory_bytes and mem and plan.memory_bytes > mem:
        out.append(
            f"the plan needs at least {plan.memory_bytes / GIB:.1f} GiB of memory for the model alone "
            f"(learners: weights, gradients and AdamW moments; CPU samplers: one copy each) but "
            f"{have.format(n=f'{mem / GIB:.1f} GiB')}: use fewer samplers or learners, learners.zero_stage>=1 with more "
            "learners, or a larger machine"
        )
    store = float(resources.get("object_store_memory", 0))
    if plan.object_store_bytes and store and plan.object_store_bytes > store:
        out.append(
            f"the object-store weight transport keeps up to {plan.object_store_bytes / GIB:.2f} GiB of "
            f"exported weights but the object store holds {store / GIB:.2f} GiB: start Ray with a "
            "larger --object-store-memory, or (vLLM samplers) set async.weight_sync=collective"
        )
    if not out and nodes:
        s, lr = cfg.samplers, cfg.learners
        tp = f", tensor parallel {s.tensor_parallel_size}" if s.tensor_parallel_size > 1 else ""
        items = [
            (
                f"sampler {i} ({_num(s.num_cpus)} CPU, {_num(sampler_gpus(cfg))} GPU{tp})",
                s.num_cpus,
                sampler_gpus(cfg),
            )
            for i in range(s.num)
        ]
        items += [
            (
                f"learner bundle {i} ({_num(lr.num_cpus)} CPU, {_num(lr.num_gpus)} GPU)",
                lr.num_cpus,
                lr.num_gpus,
            )
            for i in range(lr.num)
        ]
        stuck = _pack(items, nodes)
        if stuck is not None:
            sizes = ", ".join(
                f"{_num(float(n.get('CPU', 0)))} CPU/{_num(float(n.get('GPU', 0)))} GPU" for n in nodes
            )
            out.append(
                f"the plan's totals fit but {stuck} fits on no node (one actor or bundle cannot span nodes; "
                f"nodes: {sizes}): use smaller samplers.num_cpus/num_gpus or learners.num_cpus/num_gpus, "
                "or larger nodes"
            )
    return out


def check_fits(
    cfg: Config, plan: ResourcePlan, total: Mapping[str, float], nodes: Sequence[Mapping[str, float]] = ()
) -> None:
    """Raise ResourceError when the plan can never be placed on a cluster with these totals."""
    problems = shortfalls(cfg, plan, total, nodes)
    if problems:
        raise ResourceError("the run cannot be placed on this Ray cluster:\n  - " + "\n  - ".join(problems))


def alive_nodes(ray: Any) -> list[dict[str, float]]:
    """The resources of each alive node of the connected cluster ([] when they cannot be listed)."""
    try:
        return [dict(n.get("Resources", {})) for n in ray.nodes() if n.get("Alive")]
    except Exception:  # noqa: BLE001 - node listing is an aid to the message, never a reason to fail
        return []


def check_cluster(cfg: Config, *, model_path: str | Path | None = None, wait_s: float = 30.0) -> ResourcePlan:
    """Check the plan against the connected Ray cluster (call after `ray.init`, before any actor starts).

    Fails at once when the cluster can never hold the plan; waits up to `wait_s` for resources that
    exist but are held (e.g. by a previous run's actors being released), then fails naming them.
    """
    import ray

    plan = plan_resources(cfg, model_bytes=model_weight_bytes(model_path))
    if os.environ.get("EXGRPO_SKIP_RESOURCE_CHECK"):  # e.g. an autoscaling cluster that adds nodes on demand
        log.warning("EXGRPO_SKIP_RESOURCE_CHECK is set: not checking the plan against the cluster")
        return plan
    total = ray.cluster_resources()
    check_fits(cfg, plan, total, alive_nodes(ray))
    deadline = time.monotonic() + wait_s
    logged = False
    while True:
        free = ray.available_resources()
        busy = shortfalls(
            cfg,
            plan,
            {"CPU": free.get("CPU", 0.0), "GPU": free.get("GPU", 0.0)},
            have="only {n} are free now (other jobs or actors hold the rest; see `ray status`)",
        )
        if not busy:
            return plan
        if time.monotonic() >= deadline:
            raise ResourceError(
                f"the run does not fit the free resources of this Ray cluster after waiting "
                f"{wait_s:g} s:\n  - " + "\n  - ".join(busy)
            )
        if not logged:
            log.warning("waiting up to %.0f s for cluster resources: %s", wait_s, "; ".join(busy))
            logged = True
        time.sleep(0.25)


def placement_plan(cfg: Config) -> str:
    """Which actors start, with which resources, the longest sampler call and, for GPU runs, the time a step
    and the run would take at the recorded rates (`python -m exgrpo.run --dry-run`)."""
    s, lr, r = cfg.samplers, cfg.learners, cfg.replay
    rows = [
        (learner_name(i), lr.num_cpus, lr.num_gpus, "placement group 'learners' (PACK)")
        for i in range(lr.num)
    ]
    note = f"engine={s.engine}"
    if s.tensor_parallel_size > 1:
        note += (
            f", tensor parallel {s.tensor_parallel_size}: placement group of {s.tensor_parallel_size} x "
            f"{_num(s.num_gpus)} GPU (STRICT_PACK)"
        )
    rows += [(sampler_name(i), s.num_cpus, sampler_gpus(cfg), note) for i in range(s.num)]
    rows += [(replay_name(i), 0, 0, "replay shard") for i in range(r.num_shards)]
    rows += [(CONTROLLER, 0, 0, "scaling controller")]
    width = max(len(n) for n, *_ in rows)
    lines = [f"{'actor':<{width}}  {'CPUs':>5}  {'GPUs':>5}  notes"]
    lines += [f"{n:<{width}}  {c:>5g}  {g:>5g}  {note}" for n, c, g, note in rows]
    lines.append(
        f"total: {sum(c for _, c, _, _ in rows):g} CPUs, {sum(g for _, _, g, _ in rows):g} GPUs; learner ZeRO "
        f"stage {lr.zero_stage}, weight sync {cfg.async_.weight_sync}, max staleness {cfg.async_.max_staleness}"
    )
    lines.append(longest_call(cfg))
    if estimate := step_time(cfg):
        lines.append(estimate)
    return "\n".join(lines)


def samplers_that_fit(*, current: int, cpus: float, gpus: float, free: Mapping[str, float]) -> int:
    """How many samplers the job can run now: `current` plus as many more as the cluster's free CPUs and
    GPUs (`ray.available_resources()`) can place at `cpus`/`gpus` each (a sampler that reserves nothing
    always fits)."""
    more = []
    for need, have in ((cpus, free.get("CPU", 0.0)), (gpus, free.get("GPU", 0.0))):
        if need > 0:
            more.append(int((have + 1e-9) // need))
    return current + min(more) if more else 2**31 - 1
