"""Soak: train for --minutes on a real local Ray cluster while samplers and replay shards are SIGKILLed at
random (seeded) intervals, and account for every request.

    python -m bench.system.soak --minutes 20 --out soak-results.json [--seed 0] [--kill-every 20 40] [--kill-learners]

What it records (`groups_lost` must be 0) and how kills are spaced: docs/benchmarks.md, "Soak under random
kills".
"""

from __future__ import annotations

import argparse
import os
import random
import re
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import ray

from bench.common import write_json
from exgrpo.core import metric_names as M
from exgrpo.core.config_files import load_config
from exgrpo.loop.observer import Observer
from exgrpo.runtime.recipe import train

CLASS = {"sampler": "Sampler", "shard": "ReplayShard", "learner": "Learner"}


def process_kind(title: str) -> str | None:
    """The kind of a Ray worker's process title: `ray::ReplayShard` (idle), `ray::Sampler.generate` or
    `ray::exgrpo-sampler-0:Sampler.__init__` (in a call; Ray puts the actor's name first)."""
    match = re.match(r"ray::(?:[^:\s]+:)?(\w+)(?:\.|\s|$)", title)
    return next((k for k, c in CLASS.items() if match and match.group(1) == c), None)


class SoakDone(Exception):
    """Raised by the observer at the deadline: the soak's way to end a run that would go on for ever."""


def actor_pids(kind: str) -> set[int]:
    """PIDs of this process's Ray workers running an actor of `kind` (their process title), never another job's."""
    out = set()
    for p in psutil.Process(os.getpid()).children(recursive=True):
        try:
            title = " ".join(p.cmdline())
            if p.status() != psutil.STATUS_ZOMBIE and process_kind(title) == kind:
                out.add(p.pid)
        except psutil.Error:
            continue
    return out


class Killer(threading.Thread):
    """SIGKILLs a random actor of a random kind every `interval` (uniform) seconds, after the last one recovered."""

    def __init__(
        self,
        *,
        kinds: list[str],
        interval: tuple[float, float],
        seed: int,
        steps: list[float],
        last_kill: float = float("inf"),
    ) -> None:
        super().__init__(daemon=True)
        self.kinds, self.interval, self.rng = kinds, interval, random.Random(seed)
        self.last_kill = last_kill  # time.monotonic() after which no kill starts (each gets time to recover)
        self.step_times = steps  # wall times at which steps finished (appended by the observer)
        self.stop = threading.Event()
        self.kills: list[dict[str, Any]] = []
        self.t0 = time.monotonic()

    def run(self) -> None:
        while not self.stop.wait(self.rng.uniform(*self.interval)):
            if time.monotonic() > self.last_kill:
                break
            kind = self.rng.choice(self.kinds)
            before = actor_pids(kind)
            if not before:
                continue
            pid = self.rng.choice(sorted(before))
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                continue
            at = time.monotonic()
            kill = {"t_s": round(at - self.t0, 2), "kind": kind, "pid": pid, "recovered_s": None}
            self.kills.append(kill)
            print(f"[soak] {kill['t_s']:8.1f} s: killed {kind} pid {pid}", flush=True)
            while not self.stop.is_set() and time.monotonic() - at < 600:
                new = actor_pids(kind) - before
                stepped = any(t > at for t in self.step_times[-3:])
                if new and stepped:
                    kill["recovered_s"] = round(time.monotonic() - at, 2)
                    break
                time.sleep(0.1)


class Soak(Observer):
    """Counts every batch and step; at the deadline gathers the accounting and stops the run."""

    def __init__(self, *, deadline: float, killer: Killer, B: int) -> None:
        self.deadline, self.killer, self.B = deadline, killer, B
        self.by_step: dict[int, list[int]] = {}  # step -> the request ids it trained
        self.batch: list[int] = []  # the batch of the step in progress
        self.bad_steps: list[tuple[int, int]] = []  # (step, groups) of steps that trained != B groups
        self.records: list[dict[str, Any]] = []
        self.accounting: dict[str, Any] = {}
        self.train_start: float | None = None
        self.system: Any = None
        self.recoveries: list[int] = []  # the step each in-job recovery restarted at

    @property
    def trained(self) -> list[int]:
        return [r for ids in self.by_step.values() for r in ids]

    def on_train_start(self, *, system: Any, driver: Any) -> None:
        first = self.system is None
        self.system, self.driver = system, driver
        if first:
            self.killer.t0 = self.train_start = time.monotonic()
            self.killer.start()
            return
        # a recovery restored its checkpoint: the steps from driver.step on are trained again
        self.recoveries.append(driver.step)
        self.by_step = {s: ids for s, ids in self.by_step.items() if s < driver.step}
        self.records = [r for r in self.records if r[M.STEP] < driver.step]
        self.bad_steps = [b for b in self.bad_steps if b[0] < driver.step]
        print(f"[soak] recovery {len(self.recoveries)}: restarted at step {driver.step}", flush=True)

    def on_batch(self, *, batch: Any) -> None:
        self.batch = [g.request_id for g in batch.groups]
        if len(batch.groups) != self.B:
            self.bad_steps.append((self.driver.step, len(batch.groups)))

    def on_step(self, *, record: dict[str, Any]) -> None:
        self.by_step[record[M.STEP]] = self.batch
        self.records.append(record)
        self.killer.step_times.append(time.monotonic())
        if time.monotonic() >= self.deadline:
            self.killer.stop.set()
            self.killer.join()
            self.accounting = self.account(step=record[M.STEP])
            raise SoakDone

    def account(self, *, step: int) -> dict[str, Any]:
        driver = self.driver
        issued = driver.scheduler.next_request_id  # ids 1..issued
        open_ids = {r for s, p in driver.scheduler.plans.items() if s != step for r in p.request_ids}
        replaced = int(sum(r.get(M.REPLACED, 0) for r in self.records))
        trained = set(self.trained)
        pushed: set[int] = set()
        for shard in self.system.replay.shards:  # the shards' pushed-id sets (their idempotency record)
            pushed |= set(ray.get(shard.__ray_call__.remote(lambda self: sorted(self._seen))))
        return {
            "requests_issued": issued,
            "requests_trained": len(self.trained),
            "recoveries": len(self.recoveries),
            "recovered_at_steps": self.recoveries,
            "requests_replaced_by_fresh": replaced,
            "requests_open": len(open_ids),
            "requests_pushed": len(pushed),
            "groups_lost": issued - len(trained) - replaced - len(open_ids),
            "trained_twice": len(self.trained) - len(trained),
            "trained_not_pushed": sorted(trained - pushed)[:20],
            "pushed_not_issued": sorted(r for r in pushed if not 1 <= r <= issued)[:20],
            "replay_stats": self.system.replay.stats().__dict__,
            "sampler_replacements": self.system.samplers.restarts,
        }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--minutes", type=float, default=20.0)
    ap.add_argument("--out", required=True, help="JSON file for the results")
    ap.add_argument("--seed", type=int, default=0, help="seed of the kill schedule")
    ap.add_argument("--kill-every", type=float, nargs=2, default=(20.0, 40.0), metavar=("MIN_S", "MAX_S"))
    ap.add_argument("--kill-learners", action="store_true", help="also kill learners (the run heals itself)")
    ap.add_argument("--quiet-s", type=float, default=180.0, help="no kill starts in the last QUIET_S seconds")
    ap.add_argument("--run-dir", default=None, help="run directory (default: next to --out)")
    ap.add_argument("--set", nargs="*", default=[], help="extra config overrides key=value")
    args = ap.parse_args(argv)
    out = Path(args.out).resolve()
    run_dir = Path(args.run_dir or out.with_suffix("")).resolve()
    if run_dir.exists():
        import shutil

        shutil.rmtree(run_dir)
    cfg = load_config(
        "tiny-cpu",
        [
            "trainer.steps=1000000",
            "trainer.checkpoint_every=25",
            "trainer.eval_every=100",
            "data.num_eval=8",
            "replay.shard_max_restarts=100000",
            "logging.progress=false",
            f"logging.run_dir={run_dir}",
            *(["trainer.max_failures=1000"] if args.kill_learners else []),
            *args.set,
        ],
    )
    kinds = ["sampler", "shard"] + (["learner"] if args.kill_learners else [])
    t0 = time.monotonic()
    deadline = t0 + 60 * args.minutes
    killer = Killer(
        kinds=kinds,
        interval=tuple(args.kill_every),
        seed=args.seed,
        steps=[],
        last_kill=deadline - args.quiet_s,
    )
    soak = Soak(deadline=deadline, killer=killer, B=cfg.trainer.questions_per_step)
    error = None
    try:
        train(cfg, checkpoints=True, observer=soak, stall_timeout_s=600)
        error = "the run finished before the deadline"
    except SoakDone:
        pass
    except BaseException as err:  # noqa: BLE001 - recorded: a soak reports how it ended
        error = f"{type(err).__name__}: {err}"
    finally:
        killer.stop.set()
    wall = time.monotonic() - t0
    by_kind = {k: sum(1 for x in killer.kills if x["kind"] == k) for k in kinds}
    recovered = [x["recovered_s"] for x in killer.kills if x["recovered_s"] is not None]
    result = {
        "command": " ".join([sys.executable, *sys.argv]),
        "minutes": args.minutes,
        "seed": args.seed,
        "kill_every_s": list(args.kill_every),
        "wall_s": round(wall, 1),
        "setup_s": round(soak.train_start - t0, 1) if soak.train_start is not None else None,
        "error": error,
        "steps_trained": len(soak.records),
        "questions_per_step": cfg.trainer.questions_per_step,
        "steps_not_B_groups": soak.bad_steps,
        "kills_by_kind": by_kind,
        "kills_recovered": len(recovered),
        "recovery_s_max": max(recovered, default=None),
        "recovery_s_mean": round(sum(recovered) / len(recovered), 2) if recovered else None,
        **soak.accounting,
        "kills": killer.kills,
    }
    write_json(out, result, indent=1)
    ok = (
        error is None
        and not soak.bad_steps
        and soak.accounting.get("groups_lost") == 0
        and soak.accounting.get("trained_twice") == 0
        and not soak.accounting.get("trained_not_pushed")
        and len(recovered) == len(killer.kills)
    )
    print(
        f"[soak] {'OK' if ok else 'FAILED'}: {len(soak.records)} steps in {wall / 60:.1f} min; kills {by_kind}, "
        f"{len(recovered)} recovered (max {result['recovery_s_max']} s); groups lost "
        f"{soak.accounting.get('groups_lost')}; error {error}; results in {out}",
        flush=True,
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
