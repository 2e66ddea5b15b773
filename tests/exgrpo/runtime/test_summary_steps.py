"""summary.txt of a stopped run says "25 of 40" steps, and after a resume its wall time covers every start (or
says which part it covers). Before: "steps 25" and the wall time of the last start alone."""

from __future__ import annotations

import json

from exgrpo.core.config_files import load_config
from exgrpo.reporting.report import RunFacts, write_report


def _records(steps):
    return [{"step": i, "rollout/tokens": 10, "time/step_s": 1.0} for i in range(steps)]


def _write(run_dir, steps, wall_s, planned=40):
    yaml = load_config("tiny-cpu", [f"trainer.steps={planned}"]).to_yaml()
    return write_report(
        run_dir,
        records=_records(steps),
        evals=[],
        wall_s=wall_s,
        facts=RunFacts(config_yaml=yaml),
        plots=False,
    )


def test_a_stopped_run_says_how_many_of_its_steps_it_trained(tmp_path, capsys):
    s = _write(tmp_path, 25, 100.0)
    text = (tmp_path / "summary.txt").read_text()
    assert any(line.split() == ["steps", "25", "of", "40"] for line in text.splitlines()), text
    assert s["steps"] == 25 and s["steps_planned"] == 40


def test_after_a_resume_the_wall_time_covers_every_start(tmp_path, capsys):
    _write(tmp_path, 25, 100.0)  # stopped at step 25
    s = _write(tmp_path, 40, 60.0)  # resumed to the end
    assert s["wall_s"] == 160.0 and s["wall_s_starts"] == [100.0, 60.0]
    text = (tmp_path / "summary.txt").read_text()
    assert "wall time (s)" in text and "160.000 (2 starts: 100.0 + 60.0)" in text
    assert json.loads((tmp_path / "summary.json").read_text())["wall_s"] == 160.0


def test_a_new_run_over_a_finished_one_does_not_add_its_time(tmp_path, capsys):
    _write(tmp_path, 40, 100.0)
    s = _write(tmp_path, 40, 60.0)
    assert s["wall_s"] == 60.0 and s["wall_s_starts"] == [60.0]
