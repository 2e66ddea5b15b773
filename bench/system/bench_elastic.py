"""Elastic samplers against the best fixed sampler count, with and without preemption (issue 44).

    RAY_AUTH_MODE=disabled OMP_NUM_THREADS=1 .venv/bin/python -m bench.system.bench_elastic [--quick]
        [--no-autoscaler] [--counts 2 4 6 8] [--steps 80] [--preempt-every 6] [--repeats 1] [--node-probe-s S]
        [--json out.json]

The simulated cluster on Ray's real autoscaler (fake nodes on this machine); the runs, what is timed and the
budget: docs/benchmarks.md, "Elastic samplers".
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import time
from typing import Any

from bench.system.elastic_watch import (
    Chaos,
    ElasticRun,
    NodeCpu,
    NodeWatch,
    StepTrace,
    at_target,
    detections,
    preemption_lines,
    recoveries,
    replacements,
    span,
)

B, K = 16, 4


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench.system.bench_elastic", description=__doc__.split("\n")[0]
    )
    p.add_argument("--quick", action="store_true", help="counts 2 4 6 8, 40 steps per run (a few minutes)")
    p.add_argument("--counts", type=int, nargs="+", default=None, help="fixed sampler counts to sweep")
    p.add_argument("--steps", type=int, default=None, help="steps per run (default 80; --quick 40)")
    p.add_argument("--gen-s", type=float, default=2.4, help="real s for one sampler to generate a step")
    p.add_argument("--update-s", type=float, default=0.4, help="real s of one update")
    p.add_argument(
        "--preempt-every", type=int, default=6, help="steps between preemptions of 1/4 of the nodes"
    )
    p.add_argument(
        "--autoscaler",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="Ray's autoscaler with fake nodes (default); --no-autoscaler: a plain local cluster",
    )
    p.add_argument("--node-cpus", type=int, default=2, help="CPUs (samplers) per autoscaled node")
    p.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="rounds of the best count and elastic, each with and without preemption",
    )
    p.add_argument(
        "--node-probe-s",
        type=float,
        default=None,
        help="samplers.node_probe_s (default: the config's; 0: no probe, the failed calls tell)",
    )
    p.add_argument("--json", default=None, help="also write the runs as JSON here")
    return p


def one_run(
    sim: Any,
    *,
    samplers: int,
    steps: int,
    autoscale: bool,
    max_samplers: int,
    preempt_every: int,
    fa: Any = None,
    nodes: NodeWatch | None = None,
    cpu: NodeCpu | None = None,
) -> ElasticRun:
    """One run from one started sampler (and, on the autoscaler, no worker node): a fixed count starts its
    other samplers first (and waits for them), elastic grows as its policy decides; both pay their samplers'
    starts (and node launches) inside the timed window."""
    from exgrpo.core import metric_names as M
    from exgrpo.core.config_files import load_config
    from exgrpo.loop.driver import Driver, Roles

    sim.scale(1)
    sim.system.samplers.wait_started(timeout_s=120)
    settle_s = fa.wait_nodes(0, timeout_s=300, at_most=True) if fa is not None else 0.0
    sim.reset()
    cfg = load_config(
        None,
        [
            *sim.base,
            "async.max_staleness=1",
            "replay.enabled=true",
            f"trainer.steps={steps}",
            f"samplers.autoscale={str(autoscale).lower()}",
            "samplers.autoscale_min=1",
            f"samplers.autoscale_max={max_samplers}",
        ],
    )
    s = sim.system
    trace = StepTrace(s.samplers)
    chaos = Chaos(trace, s.samplers, preempt_every, fa)
    driver = Driver(
        cfg=cfg,
        roles=Roles(rollouts=s.samplers, replay=s.replay, learners=s.learners, weights=s.weights),
        train=sim.prompts,
        observer=trace,
        stall_timeout_s=300.0,
    )
    t0 = time.perf_counter()
    m0 = time.monotonic()
    if not autoscale:
        sim.scale(samplers)
        sim.system.samplers.wait_started(timeout_s=300)
    start_s = time.perf_counter() - t0
    chaos.start()
    try:
        records = driver.train()
    finally:
        chaos.stop.set()
        chaos.join()
    wall = time.perf_counter() - t0  # includes start_s
    end = time.monotonic()
    trained = int(sum(r[M.N_FRESH] + r[M.N_REPLAY] for r in records))
    # growth: when the target first rose (elastic: the decision; fixed: the ask at t0), and the node joins
    # that followed before the first kill
    kills = chaos.kills
    first_kill = kills[0]["t"] if kills else end
    asked = m0
    if autoscale:
        asked = next((t for t, tgt in zip(trace.times, trace.targets, strict=True) if tgt > 1), m0)
    growth = [j - asked for j in nodes.joins(m0, first_kill)] if nodes is not None else []
    return ElasticRun(
        arm="elastic" if autoscale else "fixed",
        samplers=max_samplers if autoscale else samplers,
        settle_s=round(settle_s, 1),
        start_s=round(start_s, 2),
        preempt=bool(preempt_every),
        steps=len(records),
        wall_s=round(wall, 2),
        groups_per_s=round(trained / wall, 3),
        lost=B * steps - trained,
        preempted=chaos.killed,
        preempted_samplers=sum(k["samplers"] for k in kills),
        samplers_over_time=tuple(trace.samplers),
        step_times=tuple(round(t - m0, 2) for t in trace.times),
        decisions=tuple((d.step, d.old, d.new, d.reason) for d in driver.fleet.decisions),
        first_growth_step=next((i for i, tgt in enumerate(trace.targets) if tgt > 1), None),
        growth_node_joins_s=tuple(round(g, 1) for g in growth),
        at_target_s=at_target(trace, m0),
        kills=tuple(
            {"at_s": round(k["t"] - m0, 1), "nodes": k["nodes"], "samplers": k["samplers"], "live": k["live"]}
            for k in kills
        ),
        replace_node_s=tuple(round(r, 1) for r in replacements(nodes, kills, end)),
        node_cpu_s=round(cpu.cpu_s(m0, end), 1) if cpu is not None else None,
        replacement_cpu_s=round(cpu.cpu_s(first_kill, end), 1) if cpu is not None and kills else None,
        recover_s=tuple(round(r, 1) for r in recoveries(trace, kills, end)),
        seen_lost_s=tuple(round(d, 2) for d in detections(s.samplers.lost_at, kills)),
    )


def row(run: ElasticRun) -> str:
    over = run.samplers_over_time
    trace = " ".join(str(n) for n in over[:: max(1, len(over) // 12)])
    return (
        f"{run.name:>8} {'yes' if run.preempt else 'no':>8} {run.groups_per_s:>9.2f} "
        f"{run.wall_s:>7.1f} {run.start_s:>7.1f} {run.preempted:>9} {run.lost:>5}  {trace}"
    )


def start_autoscaler(args: argparse.Namespace, top: int) -> tuple[Any, NodeWatch, NodeCpu]:
    """Ray's autoscaler with the fake multi-node provider, this process connected, and the node watchers."""
    import ray

    from bench.sim.autoscaler import FakeAutoscaler

    need = math.ceil((top - 1) / args.node_cpus)  # the head holds one sampler
    fa = FakeAutoscaler(max_workers=need + 2, idle_timeout_minutes=0.1, node_cpus=args.node_cpus, head_cpus=1)
    t = time.monotonic()
    fa.start()
    ray.init(
        address=fa.address,
        namespace="exgrpo",
        logging_level="ERROR",
        configure_logging=False,
        log_to_driver=False,
    )
    print(
        f"# Ray's autoscaler (fake multi-node provider, this machine): head of 1 CPU, sampler nodes of "
        f"{args.node_cpus} CPUs (at most {need + 2}), idle timeout 6 s; head up in {time.monotonic() - t:.1f} s",
        flush=True,
    )
    nodes, cpu = NodeWatch(), NodeCpu(fa)
    nodes.start()
    cpu.start()
    return fa, nodes, cpu


def main() -> None:
    args = make_parser().parse_args()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import logging

    import ray

    from bench.sim.cluster import SimCluster
    from bench.sim.roles import CostModel

    counts = args.counts or [2, 4, 6, 8]
    steps = args.steps or (40 if args.quick else 80)
    top = max(counts)
    logging.getLogger("exgrpo").setLevel(logging.ERROR)
    logging.getLogger("ray").setLevel(logging.ERROR)
    logging.getLogger("actors").setLevel(logging.CRITICAL)
    print(f"# python -m bench.system.bench_elastic {' '.join(sys.argv[1:])}".rstrip())
    print(
        f"# load average at start: {os.getloadavg()[0]:.1f} (2 cores shared with other users' jobs)",
        flush=True,
    )
    fa: Any = None
    nodes: NodeWatch | None = None
    cpu: NodeCpu | None = None
    overrides = ["samplers.autoscale_hysteresis=1", "samplers.autoscale_cooldown=2"]
    if args.node_probe_s is not None:
        overrides.append(f"samplers.node_probe_s={args.node_probe_s}")
    if args.autoscaler:
        fa, nodes, cpu = start_autoscaler(args, top)
        # every sampler reserves 1 CPU (so needs a node); the pool asks the autoscaler for the target's bundles
        overrides += ["samplers.num_cpus=1", "samplers.autoscale=true", "samplers.preempt_grace_s=2"]
    else:
        ray.init(
            address="local", num_cpus=4, include_dashboard=False, namespace="exgrpo", log_to_driver=False
        )
    scale = args.gen_s / 800.0  # real s per simulated s: one sampler, one step's batch = 800 simulated s
    cost = CostModel(gen_s=800.0, update_s=args.update_s / scale, time_scale=scale, batch_rollouts=B * K)
    runs: list[ElasticRun] = []
    try:
        sim = SimCluster(
            samplers=1 if fa is not None else top,
            learners=1,
            cost=cost,
            questions_per_step=B,
            rollouts_per_question=K,
            requests_per_call=2,
            shards=1,
            questions=8192,
            overrides=overrides,
        )
        try:
            if fa is None:
                sim.scale(top)
            sim.run(eta=1, replay=True, steps=3, warmup=2)  # the actors' first calls are slow
            kw = {"max_samplers": top, "fa": fa, "nodes": nodes, "cpu": cpu}
            for n in counts:
                runs.append(one_run(sim, samplers=n, steps=steps, autoscale=False, preempt_every=0, **kw))
                print(row(runs[-1]), flush=True)
            best = max(runs, key=lambda r: r.groups_per_s)
            fixed, every = best.samplers, args.preempt_every
            for rnd in range(args.repeats):  # round 0 reuses the sweep's run of the best count
                arms = [(fixed, False, 0)] if rnd else []
                arms += [(1, True, 0), (fixed, False, every), (1, True, every)]
                for n, auto, pre in arms:
                    run = one_run(sim, samplers=n, steps=steps, autoscale=auto, preempt_every=pre, **kw)
                    runs.append(dataclasses.replace(run, round=rnd))
                    print(row(runs[-1]), flush=True)
        finally:
            sim.shutdown()
    finally:
        for watcher in (nodes, cpu):
            if watcher is not None:
                watcher.stop.set()
        ray.shutdown()
        if fa is not None:
            fa.stop()
    report(runs, best, args)


def report(runs: list[ElasticRun], best: ElasticRun, args: argparse.Namespace) -> None:
    print()
    head = f"{'samplers':>8} {'preempt':>8} {'groups/s':>9} {'wall s':>7} {'start s':>7} {'preempted':>9} {'lost':>5}"
    print(head + "  samplers over time")
    for r in runs:
        print(row(r))
    for r in runs:
        for d in r.decisions[:6]:
            print(f"# {'preempted' if r.preempt else 'elastic'} run, step {d[0]}: {d[1]} -> {d[2]} ({d[3]})")
    elastic = next(r for r in runs if r.arm == "elastic" and not r.preempt)
    elastic_pre = [r for r in runs if r.arm == "elastic" and r.preempt]
    for r in runs:
        name = "elastic" if r.arm == "elastic" else f"fixed {r.samplers}"
        name += ", preempted" if r.preempt else ""
        if r.growth_node_joins_s:
            whence = "the policy's first growth" if r.arm == "elastic" else "the ask"
            print(f"# {name}: nodes joined {r.growth_node_joins_s} s after {whence}", end="")
            print(f"; all samplers serving {r.at_target_s} s into the run" if r.at_target_s else "")
    launches = [g for r in runs if r.arm != "elastic" for g in r.growth_node_joins_s]
    replaced = [x for r in runs for x in r.replace_node_s]
    recovered = [x for r in runs for x in r.recover_s]
    if launches:
        print(f"# node launch (fixed counts, ask -> node alive): {span(launches)}")
    if replaced:
        print(f"# node replacement (raylet killed -> a new node alive): {span(replaced)}")
    seen = [x for r in runs for x in r.seen_lost_s]
    if seen:
        print(f"# a kill seen by the pool (raylet killed -> its samplers lost): {span(seen, 2)}")
    if recovered:
        print(f"# pool back at its count after a kill (at step ends): {span(recovered)}")
    if elastic.first_growth_step is not None:
        fixed_best = best
        print(
            f"# elastic: steps 0..{elastic.first_growth_step} decided on 1 sampler; its steps landed at "
            f"{elastic.step_times[:8]} s; all samplers serving at {elastic.at_target_s} s "
            f"(best fixed: {fixed_best.start_s:.1f} s of start, then {fixed_best.wall_s - fixed_best.start_s:.1f} s of steps)"
        )
    cores = os.cpu_count() or 1
    launched = [(r.node_cpu_s, len(r.growth_node_joins_s)) for r in runs if r.node_cpu_s and not r.preempt]
    if launched:
        per = sum(c for c, _ in launched) / max(1, sum(n for _, n in launched))
        print(
            f"# a node's launch took {per:.1f} CPU-s of this machine's {cores} cores (unpreempted runs' node processes)"
        )
    preemption_lines(runs, cores)
    if args.json:
        with open(args.json, "w") as f:
            json.dump([dataclasses.asdict(r) for r in runs], f, indent=1)
    ratio = elastic.groups_per_s / best.groups_per_s
    preempted = sum(r.preempted for r in elastic_pre)
    lost = sum(r.lost for r in runs)
    print(
        f"elastic: throughput {ratio:.2f} of the best fixed count ({best.samplers} samplers), "
        f"preempted {preempted} nodes, lost {lost} groups"
    )


if __name__ == "__main__":
    main()
