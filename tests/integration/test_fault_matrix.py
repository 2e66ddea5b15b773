"""The fault matrix: every kind of actor killed at every named moment (`exgrpo.core.faults.POINTS`), one
short run per cell on one shared local Ray cluster, each checked against the outcome its guarantee states
(`EXPECTED`, docs/failures.md).

Every cell is the same 4-step run (configs/tiny-cpu.yaml: 2 HF samplers, 2 replay shards with their
write-ahead log, 1 learner; eta = 0 and a checkpoint after every step, so it is deterministic) with one
fault armed through `EXGRPO_FAULTS`, targeted at one actor and fired once (its marker proves it fired).
Outcomes:
  - "survives": the run trains all its steps, each with B groups, no request twice, and its batches (every
    request id, qid, kind, and every trajectory's tokens and reward) equal those of the same run without a
    fault: nothing acknowledged was lost, nothing was trained twice;
  - "interrupted": the run ends with `RunInterrupted` naming the dead actor, the step, the latest
    checkpoint and the resume command; `--resume` (`train(resume=True)`) then finishes the run, and its
    batches equal the unkilled run's from the checkpoint on; what is lost is the steps since that
    checkpoint, trained again.
The cells run with the local default `trainer.max_failures` = 0; with it above 0 the learner rows heal inside
the job instead (tests/integration/test_self_healing.py).

Each cell writes its measured row to $EXGRPO_FAULT_TABLE (a directory; default: the test's tmp dir);
`python -m bench.system.fault_table DIR` prints them as the table in docs/failures.md. Slow: a cell is a run
(~0.5-2 min on 2 busy cores), so the whole matrix takes many minutes.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from exgrpo.core import faults
from exgrpo.core import metric_names as M
from exgrpo.core.config_files import load_config
from exgrpo.loop.checkpoint import RunInterrupted
from exgrpo.loop.observer import Observer
from exgrpo.runtime.recipe import train

# a cell is one or two runs: on 2 cores shared with other jobs, one took more than the default 900 s
pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(2400)]

STEPS = 4
OVERRIDES = [
    f"trainer.steps={STEPS}",
    "trainer.checkpoint_every=1",
    "trainer.keep_checkpoints=10",
    "async.max_staleness=0",
    "data.num_eval=4",
    "logging.progress=false",
]

# (kind, the fault entry) -> the outcome the guarantee states. Each hit count lands in step 1 (of 0-3):
# a sampler gets one generate call per step, a shard about two pushes and one take per step.
EXPECTED = {
    ("sampler", "sampler-0:sampler.generate@2"): "survives",
    ("sampler", "sampler-1:sampler.push@2"): "survives",
    ("sampler", "sampler-0:sampler.evaluate@1"): "survives",
    ("shard", "replay-0:shard.push.before_log@3"): "survives",
    ("shard", "replay-1:shard.push.logged@3"): "survives",
    ("shard", "replay-0:shard.take.before_log@2"): "survives",
    ("shard", "replay-1:shard.take.logged@2"): "survives",
    ("learner", "learner-0:learner.update@2"): "interrupted",
    ("learner", "learner-0:learner.broadcast@2"): "interrupted",
    ("learner", "learner-0:learner.save@2"): "interrupted",
    ("controller", "controller:controller.desired_samplers@3"): "survives",  # the client starts a new one
}


# points the matrix's runs never reach (its transport opens no weight-transfer world), armed by another test
ELSEWHERE = {
    "sampler.transfer_init": "tests/integration/test_transports.py",
    "sampler.update_weights": "tests/integration/test_transports.py",
}


def test_every_fault_point_has_a_cell():
    points = {faults.parse(entry)[0].point for _, entry in EXPECTED}
    assert points | set(ELSEWHERE) == set(faults.POINTS)


class Batches(Observer):
    def __init__(self) -> None:
        self.batches: list = []

    def on_batch(self, *, batch) -> None:
        self.batches.append(batch)


def summary(batch) -> list:
    return [
        (g.request_id, g.qid, g.kind, [(t.response_ids, t.reward) for t in g.trajectories])
        for g in sorted(batch.groups, key=lambda g: g.request_id)
    ]


def config(run_dir: Path):
    return load_config("tiny-cpu", [*OVERRIDES, f"logging.run_dir={run_dir}"])


@pytest.fixture(scope="module")
def reference(ray_cluster, tmp_path_factory):
    """The unkilled run: its records and batches."""
    watch = Batches()
    result = train(config(tmp_path_factory.mktemp("reference") / "run"), observer=watch, stall_timeout_s=300)
    return result, [summary(b) for b in watch.batches]


@pytest.fixture(scope="module")
def table_dir(tmp_path_factory) -> Path:
    path = Path(os.environ.get("EXGRPO_FAULT_TABLE") or tmp_path_factory.mktemp("fault-table"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def steps_in_metrics(run_dir: Path) -> list[int]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line)["step"] for line in lines if "step" in json.loads(line)]


@pytest.mark.parametrize(("kind", "entry"), list(EXPECTED), ids=[e for _, e in EXPECTED])
def test_fault_cell(kind, entry, reference, table_dir, tmp_path, monkeypatch):
    ref_result, ref_batches = reference
    markers = tmp_path / "fired"
    monkeypatch.setenv(faults.FAULTS_VAR, entry)
    monkeypatch.setenv(faults.FAULTS_DIR_VAR, str(markers))
    run_dir = tmp_path / "run"
    watch = Batches()
    t0 = time.monotonic()
    row: dict = {"kind": kind, "fault": entry, "where": faults.POINTS[faults.parse(entry)[0].point]}
    try:
        result = train(config(run_dir), observer=watch, stall_timeout_s=300)
        outcome, interrupted = "survives", None
    except RunInterrupted as err:
        outcome, interrupted, result = "interrupted", err, None
    row["run_s"] = round(time.monotonic() - t0, 1)
    [fired] = faults.fired(markers)  # the fault really fired, once
    assert fired["entry"] == entry
    row |= {"outcome": outcome, "died": f"exgrpo-{fired['actor']}"}
    try:
        assert outcome == EXPECTED[(kind, entry)], f"{entry}: measured {outcome}"
        if outcome == "survives":
            row |= check_survived(result, watch, ref_batches, kind=kind)
        else:
            row |= check_interrupted(interrupted, run_dir, ref_batches, fired)
    finally:
        row["total_s"] = round(time.monotonic() - t0, 1)
        (table_dir / f"{kind}-{fired['entry'].replace(':', '-')}.json").write_text(json.dumps(row))


def check_survived(result, watch: Batches, ref_batches: list, *, kind: str) -> dict:
    """All steps, B groups each, no request twice, the unkilled run's batches."""
    B = 4
    assert [r[M.VERSION] for r in result.records] == list(range(1, STEPS + 1))
    assert all(len(b.groups) == B for b in watch.batches)
    trained = [g.request_id for b in watch.batches for g in b.groups]
    assert len(trained) == len(set(trained)) == STEPS * B
    assert [summary(b) for b in watch.batches] == ref_batches  # nothing lost, nothing twice, same groups
    restarts = result.records[-1][M.SAMPLER_RESTARTS]
    assert restarts == (1 if kind == "sampler" else 0)
    return {"steps": len(result.records), "sampler_restarts": restarts, "lost": "nothing"}


def check_interrupted(err: RunInterrupted, run_dir: Path, ref_batches: list, fired: dict) -> dict:
    """The message names the actor, the checkpoint and the command; `--resume` finishes the run like the
    unkilled one; metrics.jsonl records every step once."""
    text = str(err)
    assert f"exgrpo-{fired['actor']} died at step" in text, text
    assert err.checkpoint is not None and str(err.checkpoint) in text, text
    assert f"python -m exgrpo.run --resume {run_dir}" in text, text
    resumed_from = int(err.checkpoint.name.split("-")[-1])
    t0 = time.monotonic()
    again = Batches()
    result = train(config(run_dir), resume=True, observer=again, stall_timeout_s=300)
    assert [r[M.STEP] for r in result.records] == list(range(resumed_from, STEPS))
    assert [summary(b) for b in again.batches] == ref_batches[resumed_from:]
    assert steps_in_metrics(run_dir) == [-1, *range(STEPS)]  # rewound, not duplicated
    died_at = int(text.split("died at step ")[1].split(";")[0])
    return {
        "steps": STEPS,
        "died_at_step": died_at,
        "checkpoint": err.checkpoint.name,
        "resume_s": round(time.monotonic() - t0, 1),
        "lost": lost_steps(resumed_from, died_at),
    }


def lost_steps(checkpoint_step: int, died_at: int) -> str:
    """What an interrupted run loses: what it did since its checkpoint, trained again on resume."""
    return (
        f"what was done since the checkpoint of step {checkpoint_step}, trained again after --resume "
        f"(the death surfaced at step {died_at})"
    )
