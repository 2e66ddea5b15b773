"""Simulated cluster: the real driver, replay shards, sampler pool and weight transport with sleeping samplers
and learners (`bench/sim/roles.py`), measured against the cost model's ideal step.

    RAY_AUTH_MODE=disabled OMP_NUM_THREADS=1 .venv/bin/python -m bench.system.bench_sim_cluster [--diagnostics]
        [--update-real-s 1.0] [--steps 8] [--warmup 2] [--full] [--json out.jsonl]
        [--samplers 64 16] [--learners 8] [--etas 0 1] [--replay on off] [--requests-per-call 2] [--shards 2]
        [--overlap on off] [--repeat 1]
The cost model, the grid and the columns: docs/benchmarks.md, "Simulated cluster".
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

GEN_S, UPDATE_S = 800.0, 440.0


def grid(args: argparse.Namespace) -> list[tuple[int, int, int, bool]]:
    """(learners, samplers, eta, replay) in run order: per learner count, samplers descending."""
    if args.full or args.samplers or args.learners or args.etas or args.replay:
        return [
            (L, S, e, r == "on")
            for L in args.learners or (8, 1)
            for S in args.samplers or (64, 16, 4)
            for e in args.etas or (0, 1, 2)
            for r in args.replay or ("on", "off")
        ]
    out = [(8, S, e, r) for S in (64, 16) for e in (0, 1, 2) for r in (True, False)]
    out += [(8, 4, e, True) for e in (0, 1)]
    out += [(1, S, e, True) for S in (64, 16, 4) for e in (0, 1)]
    return out


# (label, samplers, etas, replay, changed settings), all with L = 8
DIAGNOSTICS: list[tuple[str, int, tuple[int, ...], tuple[bool, ...], dict[str, Any]]] = [
    ("rpc=B/S", 16, (0, 1), (True,), {"requests_per_call": 8}),  # one chunk per sampler per step
    ("rpc=B/S", 4, (0, 1), (True,), {"requests_per_call": 32}),
    ("8 shards", 64, (0, 1), (True, False), {"shards": 8}),
    ("upd 4 s", 64, (0, 1), (True,), {"update_real_s": 4.0}),  # 4x longer steps: is the overhead fixed in ms?
]


def block(
    SimCluster,
    CostModel,
    args,
    *,
    L: int,
    plan,
    update_real_s: float,
    requests_per_call: int,
    shards: int,
    label: str = "",
    variants: tuple[bool, ...] = (False,),
) -> list:
    """Build one cluster of L learners and max(S) samplers, warm it up, run `plan` [(S, eta, replay)] over it
    (samplers descending, the pool drained between) and shut it down."""
    samplers = sorted({g[0] for g in plan}, reverse=True)
    cost = CostModel(gen_s=GEN_S, update_s=UPDATE_S, time_scale=update_real_s / (UPDATE_S / L))
    t0 = time.perf_counter()
    cluster = SimCluster(
        samplers=samplers[0], learners=L, cost=cost, requests_per_call=requests_per_call, shards=shards
    )
    t1 = time.perf_counter()
    cluster.run(eta=1, replay=True, steps=args.warmup + 1, warmup=args.warmup)  # first calls warm the actors
    print(
        f"# {label or 'grid'} L={L}: start-up of {samplers[0]} samplers + {L} learners + {shards} shards "
        f"{t1 - t0:.1f} s, warm-up run {time.perf_counter() - t1:.1f} s; scale {cost.time_scale:.5f}, "
        f"requests_per_call {requests_per_call}",
        flush=True,
    )
    out = []
    for S in samplers:
        if cluster.samplers != S:
            cluster.scale(S)
        for _, eta, replay in [g for g in plan if g[0] == S]:
            for overlap in variants * args.repeat:
                t = time.perf_counter()
                run = cluster.run(
                    eta=eta,
                    replay=replay,
                    steps=args.steps,
                    warmup=args.warmup,
                    overlap=overlap,
                )
                name = label or ("ovl" if overlap else "ser")
                out.append((run, cost.time_scale, name))
                print(
                    f"#   S={S} L={L} eta={eta} replay={'on' if replay else 'off'} {name}: "
                    f"{time.perf_counter() - t:.1f} s wall, ratio {run.ratio:.3f}",
                    flush=True,
                )
    cluster.shutdown()
    return out


def stale_share(run, k: int) -> float:
    total = sum(run.staleness.values())
    return run.staleness.get(k, 0) / total if total else 0.0


def make_parser() -> argparse.ArgumentParser:
    """The command line (module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--update-real-s", type=float, default=1.0, help="real seconds of one update (sets the scale)"
    )
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=2, help="steps before the steady-state window")
    parser.add_argument("--full", action="store_true", help="all 36 combinations")
    parser.add_argument("--json", default="", help="also write one JSON line per run here")
    parser.add_argument("--samplers", type=int, nargs="+", help="a grid of these (with the other lists)")
    parser.add_argument("--learners", type=int, nargs="+")
    parser.add_argument("--etas", type=int, nargs="+")
    parser.add_argument("--replay", nargs="+", choices=("on", "off"))
    parser.add_argument(
        "--requests-per-call", type=int, default=2, help="samplers.requests_per_call (B = 128)"
    )
    parser.add_argument("--shards", type=int, default=2, help="replay.num_shards")
    parser.add_argument(
        "--overlap",
        nargs="+",
        choices=("on", "off"),
        default=["off"],
        help="async.overlap_update (both: side by side)",
    )
    parser.add_argument(
        "--repeat", type=int, default=1, help="run the variants this many times, interleaved (noise)"
    )
    parser.add_argument(
        "--diagnostics", action="store_true", help="then the DIAGNOSTICS rows (about 5 min more)"
    )
    return parser


def main() -> None:
    args = make_parser().parse_args()

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import ray

    from bench.sim.cluster import SimCluster
    from bench.sim.roles import CostModel
    from exgrpo.runtime.env import ACTOR_ENV

    logging_quiet()
    cmd = (
        "RAY_AUTH_MODE=disabled OMP_NUM_THREADS=1 .venv/bin/python -m bench.system.bench_sim_cluster "
        + " ".join(sys.argv[1:])
    )
    print(f"# {cmd.strip()}")
    print(
        f"# load average at start: {os.getloadavg()[0]:.1f} (2 cores; other users' jobs share them)",
        flush=True,
    )
    print(f"# code: {code_version()}", flush=True)
    ray.init(
        address="local",
        num_cpus=4,
        include_dashboard=False,
        namespace="exgrpo",
        runtime_env={"env_vars": ACTOR_ENV},
        configure_logging=False,
        log_to_driver=False,
    )
    t_all = time.perf_counter()
    plan = grid(args)
    runs = []
    for L in sorted({g[0] for g in plan}, reverse=True):
        runs += block(
            SimCluster,
            CostModel,
            args,
            L=L,
            plan=[g[1:] for g in plan if g[0] == L],
            update_real_s=args.update_real_s,
            requests_per_call=args.requests_per_call,
            shards=args.shards,
            variants=tuple(o == "on" for o in args.overlap),
        )
    extra = []
    if args.diagnostics:  # the same cost model with one knob changed each (see the module docstring)
        for label, S, etas, reps, kw in DIAGNOSTICS:
            extra += block(
                SimCluster,
                CostModel,
                args,
                L=8,
                plan=[(S, e, r) for e in etas for r in reps],
                label=label,
                **{
                    "update_real_s": args.update_real_s,
                    "requests_per_call": args.requests_per_call,
                    "shards": args.shards,
                    **kw,
                },
            )
    print(f"# total {time.perf_counter() - t_all:.0f} s; load average at end: {os.getloadavg()[0]:.1f}\n")
    print_tables(runs)
    if extra:
        print("\n\nDiagnostics: one knob changed from the grid's settings (label), same cost model\n")
        print_tables(extra)
    if args.json:
        with open(args.json, "w") as f:
            for run, scale, label in runs + extra:
                f.write(
                    json.dumps({**asdict(run), "scale": scale, "ratio": run.ratio, "label": label}) + "\n"
                )
    ray.shutdown()


def print_tables(runs) -> None:
    print("Step time against the ideal (real seconds, steady state)")
    head = (
        f"{'variant':>8} {'S':>3} {'L':>2} {'eta':>3} {'rep':>3} {'scale':>8} {'gen/S':>6} {'upd/L':>6} {'ideal':>6} {'step':>6} "
        f"{'ratio':>6} {'rec':>6} {'over ms':>7} {'L idle':>6} {'ideal':>6} {'st0':>5} {'st1':>5} {'st2':>5} {'repl/st':>7} "
        f"{'reiss':>5} {'groups':>6}"
    )
    print(head)
    for r, scale, label in runs:
        ideal_idle = 1.0 - r.update_s / r.ideal_s
        groups = "B each" if set(r.groups_per_step) == {128} else ",".join(map(str, r.groups_per_step))
        print(
            f"{label or 'grid':>8} {r.samplers:>3} {r.learners:>2} {r.eta:>3} {'on' if r.replay else 'off':>3} {scale:>8.5f} "
            f"{r.gen_s:>6.3f} {r.update_s:>6.3f} {r.ideal_s:>6.3f} {r.step_s:>6.3f} {r.ratio:>6.3f} "
            f"{r.record_step_s / r.ideal_s:>6.3f} "
            f"{1000 * (r.step_s - r.ideal_s):>7.0f} {r.learner_idle:>6.3f} {ideal_idle:>6.3f} "
            f"{stale_share(r, 0):>5.2f} {stale_share(r, 1):>5.2f} {stale_share(r, 2):>5.2f} "
            f"{r.replayed_per_step:>7.1f} {r.replaced:>5} {groups:>6}"
        )
    print("\nSpeed-up of eta=1 (and eta=2) over eta=0: measured vs (gen/S + upd/L) / max(gen/S, upd/L)")
    print(
        f"{'variant':>8} {'S':>3} {'L':>2} {'rep':>3} {'eta0 s':>7} {'eta1 s':>7} {'x1':>6} {'eta2 s':>7} {'x2':>6} {'predicted':>9}"
    )
    by = {(label, r.samplers, r.learners, r.replay, r.eta): r for r, _, label in runs}
    for (label, S, L, rep, eta), r0 in by.items():
        if eta != 0 or (label, S, L, rep, 1) not in by:
            continue
        r1, r2 = by[(label, S, L, rep, 1)], by.get((label, S, L, rep, 2))
        pred = (r0.gen_s + r0.update_s) / max(r0.gen_s, r0.update_s)
        e2 = f"{r2.step_s:>7.3f} {r0.step_s / r2.step_s:>6.2f}" if r2 else f"{'-':>7} {'-':>6}"
        print(
            f"{label or 'grid':>8} {S:>3} {L:>2} {'on' if rep else 'off':>3} {r0.step_s:>7.3f} {r1.step_s:>7.3f} "
            f"{r0.step_s / r1.step_s:>6.2f} {e2} {pred:>9.2f}"
        )
    print(
        "\nWhere a step goes (ms per steady-state step): driver wall time inside each verb; CPU ms of each process"
    )
    print(
        f"{'variant':>8} {'S':>3} {'L':>2} {'eta':>3} {'rep':>3} | {'submit':>6} {'poll':>6} {'sample':>6} {'pull':>6} "
        f"{'upd-c':>6} {'gap':>6} {'bcast':>6} {'rest':>6} | {'driver':>6} {'shards':>6} {'sampl':>6} {'learn':>6} {'ray':>6} "
        f"{'foreign':>7} {'busy%':>5}"
    )
    for r, _, label in runs:
        c = {k: 1000 * v for k, v in r.calls.items()}
        verbs = ("submit", "poll", "sample_questions", "pull_batch")
        upd_call = c.get("start_update", 0.0)
        inside = sum(c.get(k, 0.0) for k in (*verbs, "start_update", "broadcast"))
        rest = 1000 * r.step_s - inside
        cpu = {k: 1000 * v for k, v in r.cpu.items()}
        ours = sum(cpu[k] for k in ("driver", "shards", "samplers", "learners", "ray"))
        foreign = cpu["machine"] - ours
        busy = 100 * cpu["machine"] / (1000 * r.step_s * (os.cpu_count() or 2))
        print(
            f"{label or 'grid':>8} {r.samplers:>3} {r.learners:>2} {r.eta:>3} {'on' if r.replay else 'off':>3} | "
            + " ".join(f"{c.get(k, 0.0):>6.0f}" for k in verbs)
            + f" {upd_call:>6.0f} {1000 * r.driver['gap']:>6.0f} {c.get('broadcast', 0.0):>6.0f} {rest:>6.0f} | "
            + " ".join(f"{cpu[k]:>6.0f}" for k in ("driver", "shards", "samplers", "learners", "ray"))
            + f" {foreign:>7.0f} {busy:>5.0f}"
        )
    print(
        "\nupd-c: starting the update calls (pickling; their waits are polls, with the "
        "samplers', in poll and rest); gap: system/update_gap_s, the learners' wait for the driver between updates; "
        "poll includes waiting for generation and for the update; rest: the driver loop outside the verbs. CPU columns are CPU ms per step; busy%: the machine."
    )


def code_version() -> str:
    """HEAD and any uncommitted change to the real roles this bench runs (driver, pool, shards, transport)."""
    import subprocess

    root = Path(__file__).resolve().parents[2]
    paths = ["exgrpo/loop/driver.py", "exgrpo/runtime", "actors/pool.py", "buffers", "exgrpo/transport"]
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--short", "--", *paths], cwd=root, capture_output=True, text=True, timeout=10
        ).stdout.split()
    except (OSError, subprocess.SubprocessError):
        return "unknown (no git)"
    changed = [x for x in dirty if "/" in x or x.endswith(".py")]
    return f"git {head}" + (f", uncommitted changes in {', '.join(changed)}" if changed else "")


def logging_quiet() -> None:
    import logging

    logging.getLogger("ray").setLevel(logging.ERROR)
    logging.getLogger("exgrpo").setLevel(logging.WARNING)


if __name__ == "__main__":
    main()
