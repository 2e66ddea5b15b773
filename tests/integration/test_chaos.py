"""Chaos: a run with 2 samplers, 2 replay shards and 1 learner during which a random sampler and a
random shard are SIGKILLed (by PID) at random moments, several times, compared with the same run
without kills.

The configuration is the deterministic one (eta = 0, no evaluation): every request of step t is
sampled with the weights of version t and with the seed of its chunk's first request id, whichever
sampler serves it (both samplers have the same seed), so a re-issued request repeats its group
exactly; a restarted shard replays its write-ahead log to the state of its last acknowledged call,
so question draws repeat too. What is compared with the uninterrupted run:
  - every step trained B groups, no request id trained twice (within the run and across steps);
  - per step, the trained groups: request id, qid, kind, and every trajectory's tokens, reward and
    replayed flag (so the question choice, replay selection and generation all repeat);
  - after the run: the replay snapshot of both shards (pool table: per question its bucket, prompt and
    stored trajectories in order; ready queue; pushed request ids with their retirement flags), the
    retired set and the stats. Not compared: the order of questions inside a bucket (it is the arrival
    order of the two samplers' concurrent pushes, with or without kills; draws sort a bucket first);
  - the learner's final weights checksum.
Caveat: a question in two requests of one step (fresh and replay) stores its trajectories in push
arrival order, so such a run may differ from its reference in that question's candidate order.
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time

import psutil
import pyarrow.parquet as pq
import pytest

from exgrpo.core import metric_names as M
from exgrpo.core.config_files import load_config
from exgrpo.loop.observer import Observer
from exgrpo.runtime.recipe import train

pytestmark = pytest.mark.integration

STEPS, SEED = 10, int(os.environ.get("EXGRPO_CHAOS_SEED", "7"))
CONFIG = [
    "trainer.questions_per_step=4",
    "trainer.rollouts_per_question=4",
    f"trainer.steps={STEPS}",
    "replay.start_solve_ratio=0.0",
    "replay.num_shards=2",
    "samplers.num=2",
    "samplers.requests_per_call=2",
    "async.max_staleness=0",
    "learners.lr=1e-3",
    "learners.micro_batch_size=32",
    "model.max_response_len=12",
    "logging.progress=false",
    "logging.plots=false",
]


def actor_pids(cls: str) -> list[int]:
    """PIDs of this test's Ray worker processes running an actor of class `cls` (their process title);
    only descendants of this process (the local cluster it started), never another job's."""
    out = []
    for p in psutil.Process(os.getpid()).children(recursive=True):
        try:
            if p.status() != psutil.STATUS_ZOMBIE and p.name().startswith(f"ray::{cls}"):
                out.append(p.pid)
        except psutil.Error:
            continue
    return out


class Chaos:
    """Six kills (three of a random sampler, three of a random shard, in a random order), each armed
    after a random step and landing a random 0-250 ms later: inside the next step's generation,
    pushes, pulls or update (a step takes about 0.1-0.3 s here), or in a replacement's start-up."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        kinds = ["Sampler", "ReplayShard"] * 3
        self.rng.shuffle(kinds)
        # samplers die while >= 2 steps are left (a dead idle sampler is noticed at its next request)
        steps = sorted(self.rng.sample(range(STEPS - 3), len(kinds)))
        self.plan = dict(zip(steps, kinds, strict=True))
        self.kills: list[tuple[int, str, int]] = []  # (after step, actor class, pid)
        self.thread: threading.Thread | None = None
        self.error: BaseException | None = None

    def after_step(self, step: int) -> None:
        if self.thread is not None:
            self.thread.join()
        if step in self.plan:
            self.thread = threading.Thread(
                target=self.kill, args=(step, self.plan[step], self.rng.uniform(0, 0.25))
            )
            self.thread.start()

    def kill(self, step: int, kind: str, delay: float) -> None:
        try:
            time.sleep(delay)
            deadline = time.monotonic() + 30
            while not (pids := actor_pids(kind)) and time.monotonic() < deadline:
                time.sleep(0.05)  # a sampler being replaced, a shard restarting
            pid = self.rng.choice(sorted(pids))
            os.kill(pid, signal.SIGKILL)
            self.kills.append((step, kind, pid))
        except BaseException as e:  # noqa: BLE001 - re-raised by the test
            self.error = e


def run(tmp_path, model_path, data, *, chaos_seed=None):
    cfg = load_config(
        None,
        [
            *CONFIG,
            f"data.train={data['train']}",
            f"model.path={model_path}",
            f"logging.run_dir={tmp_path}",
            "data.eval=",
        ],
    )
    chaos = Chaos(chaos_seed) if chaos_seed is not None else None

    class Watch(Observer):
        """Every batch, chaos after every step, and the final replay contents and learner checksum."""

        def __init__(self):
            self.batches, self.final = [], None

        def on_batch(self, *, batch):
            self.batches.append(batch)

        def on_step(self, *, record):
            if chaos is not None:
                chaos.after_step(record[M.STEP])

        def on_train_end(self, *, system, driver):
            if chaos is not None:
                chaos.after_step(-1)
                assert chaos.error is None, chaos.error
            system.replay.snapshot(path=str(tmp_path / "final-replay"))
            tables = {p.name: pq.read_table(p) for p in sorted((tmp_path / "final-replay").iterdir())}
            self.final = (
                tables,
                system.replay.retired(),
                system.replay.stats(),
                system.learners.checksums()[0],
            )

    watch = Watch()
    result = train(cfg, checkpoints=False, observer=watch, stall_timeout_s=300)
    return cfg, result, watch, (chaos.kills if chaos is not None else [])


def canonical(name, table):
    """A snapshot table up to the order of what two samplers pushed concurrently: the pool table as
    qid -> (its question row, its trajectory rows in order), retired rows as a set; the ready queue
    and pushed ids by request id (a group's rows keep their order)."""
    rows = table.to_pylist()
    if name.endswith((".ready", ".seen")):
        return sorted(rows, key=lambda r: r["request_id"])
    questions: dict[str, list] = {}
    for r in rows:
        questions.setdefault(r["qid"], []).append(r)
    return questions


def summary(batch):
    return [
        (g.request_id, g.qid, g.kind, [(t.response_ids, t.reward, t.replayed) for t in g.trajectories])
        for g in sorted(batch.groups, key=lambda g: g.request_id)
    ]


@pytest.mark.slow  # 105 s in CI; each fault alone stays in CI: test_shard_restart, test_runtime's dead sampler, test_pool
def test_chaos_kills_of_samplers_and_shards_change_nothing(
    ray_cluster, tmp_path, warm_model, single_digit_data
):
    t0 = time.monotonic()
    cfg, ref, ref_watch, _ = run(tmp_path / "reference", warm_model, single_digit_data)
    t1 = time.monotonic()
    cfg, got, watch, kills = run(tmp_path / "chaos", warm_model, single_digit_data, chaos_seed=SEED)
    ref_batches, batches = ref_watch.batches, watch.batches
    t2 = time.monotonic()
    B = cfg.trainer.questions_per_step
    print(
        f"\nreference run {t1 - t0:.1f} s, chaos run {t2 - t1:.1f} s; kills (after step, actor, pid): {kills}"
    )
    kinds = [k for _, k, _ in kills]
    assert kinds.count("Sampler") == 3 and kinds.count("ReplayShard") == 3, kills
    # every step trained, each with exactly B groups, no request trained twice
    assert [r[M.VERSION] for r in got.records] == list(range(1, STEPS + 1))
    assert len(batches) == STEPS and all(len(b.groups) == B for b in batches)
    trained = [g.request_id for b in batches for g in b.groups]
    assert len(trained) == len(set(trained))
    assert got.records[-1][M.SAMPLER_RESTARTS] == kinds.count("Sampler")  # each killed sampler was replaced
    # the same run as without kills
    for t, (a, b) in enumerate(zip(ref_batches, batches, strict=True)):
        assert summary(a) == summary(b), f"step {t} differs"
    ref_tables, ref_retired, ref_stats, ref_sum = ref_watch.final
    tables, retired, stats, checksum = watch.final
    assert tables.keys() == ref_tables.keys()
    for name in tables:
        assert canonical(name, tables[name]) == canonical(name, ref_tables[name]), name
    assert retired == ref_retired and stats == ref_stats
    assert checksum == pytest.approx(ref_sum, rel=1e-6)
