"""`train(...)` with `logging.progress=false` says once, before the start-up, what it starts and that it stays
quiet (with progress on, the phase lines say it)."""

from __future__ import annotations

import exgrpo
from exgrpo.runtime import recipe


def run(monkeypatch, tmp_path, *overrides: str) -> None:
    monkeypatch.setattr(recipe, "train", lambda cfg, **_: "trained")
    assert (
        exgrpo.train("tiny-cpu", overrides=[f"logging.run_dir={tmp_path / 'run'}", *overrides]) == "trained"
    )


def test_a_quiet_start_prints_one_line_naming_what_it_starts(tmp_path, monkeypatch, capsys) -> None:
    run(monkeypatch, tmp_path, "logging.progress=false", "trainer.steps=1")
    err = capsys.readouterr().err.splitlines()
    assert err == [
        "[exgrpo] starting Ray and 2 samplers, 1 learner, 2 replay shards to train builtin:tiny for 1 step; "
        f"quiet until the summary (logging.progress=false); metrics in {tmp_path / 'run'}/metrics.jsonl"
    ]


def test_a_start_with_progress_leaves_the_telling_to_its_phase_lines(tmp_path, monkeypatch, capsys) -> None:
    run(monkeypatch, tmp_path)
    assert capsys.readouterr().err == ""
