"""Elastic samplers against the best fixed sampler count, with and without preemption (issue 44).

    RAY_AUTH_MODE=disabled OMP_NUM_THREADS=1 .venv/bin/python -m bench.system.bench_elastic [--quick]
        [--counts 2 4 6 8] [--steps 80] [--preempt-every 6] [--json out.json]

The simulated cluster (`exgrpo/sim`): the real driver, replay shards, sampler pool, object-store transport and
the autoscale policy (`exgrpo/loop/autoscale.py`), with sleeping samplers and one sleeping learner on the cost
model (`CostModel`). On a local Ray cluster, not Ray's autoscaler: a "node" here is one sampler actor, and its
replacement after a preemption is a new actor process (about a second here, where a cloud node takes minutes;
the autoscaler's own launches are measured by tests/integration/test_elastic_autoscaler.py).

Workload: B = 16 questions x K = 4 rollouts per step; one sampler generates a step's 64 rollouts in `gen` real
seconds, the learner updates in `upd` (defaults 2.4 s and 0.4 s: generation-bound below 6 samplers, learner-bound
from 6 on). Runs, in one process over one set of actors:

1. a sweep of fixed counts (`--counts`), `samplers.autoscale=false`;
2. elastic: `samplers.autoscale=true`, min 1, max = the largest count, starting from 1 sampler;
3. with preemption: the best fixed count and elastic again, a quarter of the live samplers (at least one)
   killed every `--preempt-every` steps (what a vanished spot node does to its sampler).

Throughput is trained groups per second of the whole run, every run starting from one started sampler: a fixed
count first starts its other samplers and waits for them (`start s`), elastic grows as its policy decides; both
pay their samplers' starts (here new actor processes on a loaded 2-core machine) inside the timed window. Lost groups: questions per step x steps - groups trained, over every run (0: every
admitted request came back once). The last line:
`elastic: throughput R of the best fixed count (F samplers), preempted P nodes, lost L groups`.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from typing import Any

from exgrpo.loop.observer import Observer

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
        "--preempt-every", type=int, default=6, help="steps between preemptions of 1/4 of the samplers"
    )
    p.add_argument("--json", default=None, help="also write the runs as JSON here")
    return p


class Preempt(Observer):
    """An observer: after every `every` steps, kill a quarter (at least one) of the pool's live samplers."""

    def __init__(self, pool: Any, every: int) -> None:
        self.pool, self.every, self.killed = pool, every, 0
        self.samplers: list[int] = []  # live samplers after each step
        self.records: list[dict[str, Any]] = []

    def on_step(self, *, record: dict[str, Any]) -> None:
        import ray

        from exgrpo.core import metric_names as M

        self.records.append(record)
        self.samplers.append(len(self.pool.members()))
        step = int(record[M.STEP])
        if self.every and step > 0 and step % self.every == 0:
            members = list(self.pool.members().values())
            for handle in members[: max(1, math.ceil(len(members) / 4))]:
                ray.kill(handle, no_restart=True)
                self.killed += 1


def one_run(
    sim: Any, *, samplers: int, steps: int, autoscale: bool, max_samplers: int, preempt_every: int
) -> dict[str, Any]:
    """One run from one started sampler: a fixed count starts its other samplers first (and waits for them),
    elastic grows as its policy decides; both pay their samplers' starts inside the timed window."""
    from exgrpo.core import metric_names as M
    from exgrpo.core.config_files import load_config
    from exgrpo.loop.driver import Driver, Roles

    sim.scale(1)
    sim.system.samplers.wait_started(timeout_s=120)
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
    watch = Preempt(s.samplers, preempt_every)
    driver = Driver(
        cfg=cfg,
        roles=Roles(rollouts=s.samplers, replay=s.replay, learners=s.learners, weights=s.weights),
        train=sim.prompts,
        observer=watch,
        stall_timeout_s=300.0,
    )
    t0 = time.perf_counter()
    if not autoscale:
        sim.scale(samplers)
        sim.system.samplers.wait_started(timeout_s=300)
    start_s = time.perf_counter() - t0
    records = driver.train()
    wall = time.perf_counter() - t0  # includes start_s
    trained = int(sum(r[M.N_FRESH] + r[M.N_REPLAY] for r in records))
    return {
        "samplers": "elastic" if autoscale else samplers,
        "start_s": round(start_s, 2),  # a fixed count's samplers starting (from one) before its first step
        "preempt": bool(preempt_every),
        "steps": len(records),
        "wall_s": round(wall, 2),
        "groups_per_s": round(trained / wall, 3),
        "lost": B * steps - trained,
        "preempted": watch.killed,
        "samplers_over_time": watch.samplers,
        "decisions": [(d.step, d.old, d.new, d.reason) for d in driver.fleet.decisions],
    }


def row(run: dict[str, Any]) -> str:
    over = run["samplers_over_time"]
    trace = " ".join(str(n) for n in over[:: max(1, len(over) // 12)])
    return (
        f"{run['samplers']!s:>8} {'yes' if run['preempt'] else 'no':>8} {run['groups_per_s']:>9.2f} "
        f"{run['wall_s']:>7.1f} {run['start_s']:>7.1f} {run['preempted']:>9} {run['lost']:>5}  {trace}"
    )


def main() -> None:
    args = make_parser().parse_args()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import logging

    import ray

    from exgrpo.sim.cluster import SimCluster
    from exgrpo.sim.roles import CostModel

    counts = args.counts or [2, 4, 6, 8]
    steps = args.steps or (40 if args.quick else 80)
    logging.getLogger("exgrpo").setLevel(logging.ERROR)
    logging.getLogger("ray").setLevel(logging.ERROR)
    logging.getLogger("actors").setLevel(logging.CRITICAL)
    print(f"# python -m bench.system.bench_elastic {' '.join(sys.argv[1:])}".rstrip())
    print(
        f"# load average at start: {os.getloadavg()[0]:.1f} (2 cores shared with other users' jobs)",
        flush=True,
    )
    ray.init(address="local", num_cpus=4, include_dashboard=False, namespace="exgrpo", log_to_driver=False)
    scale = args.gen_s / 800.0  # real s per simulated s: one sampler, one step's batch = 800 simulated s
    cost = CostModel(gen_s=800.0, update_s=args.update_s / scale, time_scale=scale, batch_rollouts=B * K)
    sim = SimCluster(
        samplers=max(counts),
        learners=1,
        cost=cost,
        questions_per_step=B,
        rollouts_per_question=K,
        requests_per_call=2,
        shards=1,
        questions=8192,
        overrides=["samplers.autoscale_hysteresis=1", "samplers.autoscale_cooldown=2"],
    )
    runs: list[dict[str, Any]] = []
    try:
        sim.scale(max(counts))
        sim.run(eta=1, replay=True, steps=3, warmup=2)  # the actors' first calls are slow
        top = max(counts)
        for n in counts:
            runs.append(
                one_run(sim, samplers=n, steps=steps, autoscale=False, max_samplers=top, preempt_every=0)
            )
            print(row(runs[-1]), flush=True)
        best = max(runs, key=lambda r: r["groups_per_s"])
        for preempt in (0, args.preempt_every):
            if preempt:
                fixed = int(best["samplers"])
                runs.append(
                    one_run(
                        sim,
                        samplers=fixed,
                        steps=steps,
                        autoscale=False,
                        max_samplers=top,
                        preempt_every=preempt,
                    )
                )
                print(row(runs[-1]), flush=True)
            runs.append(
                one_run(sim, samplers=1, steps=steps, autoscale=True, max_samplers=top, preempt_every=preempt)
            )
            print(row(runs[-1]), flush=True)
    finally:
        sim.shutdown()
        ray.shutdown()
    report(runs, best, args)


def report(runs: list[dict[str, Any]], best: dict[str, Any], args: argparse.Namespace) -> None:
    print()
    head = f"{'samplers':>8} {'preempt':>8} {'groups/s':>9} {'wall s':>7} {'start s':>7} {'preempted':>9} {'lost':>5}"
    print(head + "  samplers over time")
    for r in runs:
        print(row(r))
    for r in runs:
        for d in r["decisions"][:6]:
            print(
                f"# {'preempted' if r['preempt'] else 'elastic'} run, step {d[0]}: {d[1]} -> {d[2]} ({d[3]})"
            )
    elastic = next(r for r in runs if r["samplers"] == "elastic" and not r["preempt"])
    fixed_pre = [r for r in runs if r["samplers"] != "elastic" and r["preempt"]]
    elastic_pre = [r for r in runs if r["samplers"] == "elastic" and r["preempt"]]
    if fixed_pre and elastic_pre:
        print(
            f"# with preemption: fixed {best['samplers']} at {fixed_pre[0]['groups_per_s']:.2f} groups/s "
            f"({fixed_pre[0]['groups_per_s'] / best['groups_per_s']:.2f} of itself unpreempted), elastic at "
            f"{elastic_pre[0]['groups_per_s']:.2f} ({elastic_pre[0]['groups_per_s'] / elastic['groups_per_s']:.2f})"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(runs, f, indent=1)
    ratio = elastic["groups_per_s"] / best["groups_per_s"]
    preempted = sum(r["preempted"] for r in elastic_pre)
    lost = sum(r["lost"] for r in runs)
    print(
        f"elastic: throughput {ratio:.2f} of the best fixed count ({best['samplers']} samplers), "
        f"preempted {preempted} nodes, lost {lost} groups"
    )


if __name__ == "__main__":
    main()
