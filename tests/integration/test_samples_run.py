"""Generations you can read, on a real local Ray cluster: a short run with `logging.samples_every=1` writes
samples.jsonl rows that match the batches the learners trained (text, reward, bucket, origin), puts them in
report.html, logs the evaluation before the first step as metrics.jsonl's first row and ends by printing
where the run directory and the report are."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from exgrpo.core import metric_names as M
from exgrpo.core.config_files import load_config
from exgrpo.loop.observer import Observer
from exgrpo.reporting.samples import FIELDS
from exgrpo.runtime.recipe import train

pytestmark = pytest.mark.integration


class Batches(Observer):
    def __init__(self) -> None:
        self.batches: list = []

    def on_batch(self, *, batch):
        self.batches.append(batch)


def test_samples_jsonl_rows_match_the_trained_batches(
    ray_cluster, tmp_path, warm_model, single_digit_data, capfd
):
    run_dir = tmp_path / "run"
    cfg = load_config(
        "tiny-cpu",
        [
            f"model.path={warm_model}",
            "model.max_response_len=12",
            f"data.train={single_digit_data['train']}",
            f"data.eval={single_digit_data['eval']}",
            "trainer.steps=3",
            "trainer.eval_every=0",
            "samplers.num=1",
            "logging.samples_every=1",
            "logging.samples_per_step=4",
            "logging.progress=false",
            f"logging.run_dir={run_dir}",
        ],
    )
    watch = Batches()
    train(cfg, checkpoints=False, observer=watch, stall_timeout_s=300)
    questions = {
        json.loads(line)["qid"]: json.loads(line)["question"]
        for line in Path(single_digit_data["train"]).read_text().splitlines()
    }

    rows = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0] * 4 + [1] * 4 + [2] * 4
    K = cfg.trainer.rollouts_per_question
    for r in rows:
        assert tuple(r) == FIELDS
        assert 0.0 <= r["reward"] <= 1.0 and r["origin"] in ("fresh", "replayed")
        assert r["prompt"] and r["prompt"] == questions[r["qid"]]
        (group,) = [g for g in watch.batches[r["step"]].groups if g.qid == r["qid"]]
        k = sum(t.reward > 0.5 for t in group.trajectories)
        assert r["bucket"] == f"{k}/{K}"  # the correct rollouts of its group, the replayed slot included
        assert any(
            (t.text, t.reward, t.replayed, t.policy_version)
            == (r["completion"], r["reward"], r["origin"] == "replayed", r["policy_version"])
            for t in group.trajectories
        )
    assert any(r["origin"] == "replayed" for r in rows), (
        "no replayed row: the warm model should replay by step 2"
    )
    for step, batch in enumerate(watch.batches):  # both origins shown whenever the batch has both
        has_replayed = any(g.kind == "replay" for g in batch.groups)
        assert {r["origin"] for r in rows if r["step"] == step} == (
            {"fresh", "replayed"} if has_replayed else {"fresh"}
        )

    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m[M.STEP] for m in metrics] == [-1, 0, 1, 2]
    assert metrics[0][M.EVAL_VERSION] == 0 and 0.0 <= metrics[0][M.EVAL_ACCURACY] <= 1.0
    page = (run_dir / "report.html").read_text()
    assert '<table id="samples">' in page and page.count('<td class="completion">') == 12
    out = capfd.readouterr().out
    assert f"[exgrpo] run directory {run_dir.resolve()}\n" in out
    assert f"[exgrpo] report {(run_dir / 'report.html').resolve()}\n" in out
    n = cfg.trainer.eval_samples
    assert f"held-out accuracy after (Avg@{n}, T {cfg.samplers.temperature}, n {n})" in out
