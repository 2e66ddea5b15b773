"""bench.analysis.heldout on a hand-made sweep: held-out Avg@n per run from saved completions, paired differences
over seeds, the base's rare-success questions, and loud refusals of a run not evaluated or other questions."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.analysis.heldout import main, rare_questions, sweep_heldout


def _completions(path: Path, rewards: dict[str, list[float]]) -> None:
    rows = [{"qid": q, "reward": r, "sample": j} for q, rs in rewards.items() for j, r in enumerate(rs)]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def _sweep(tmp_path: Path, runs: dict[tuple[str, int], dict[str, list[float]]]) -> Path:
    sweep = tmp_path / "sweep"
    results = []
    for (variant, seed), rewards in runs.items():
        run_dir = sweep / f"{variant}-seed{seed}"
        _completions(run_dir / "heldout.jsonl", rewards)
        curve = [{"step": 0, "tokens": 0}, {"step": 60, "tokens": 1000 + seed}]
        results.append(
            {"variant": variant, "seed": seed, "run_dir": str(run_dir), "curve": curve, "wall_s": 5.0}
        )
    (sweep / "results.json").write_text(json.dumps(results))
    return sweep


def test_paired_heldout_differences_and_the_base_rare_questions(tmp_path, capsys):
    base = {"q1": [1.0, 0.0, 0.0, 0.0], "q2": [1.0, 1.0, 0.0, 0.0], "q3": [0.0] * 4, "q4": [1.0] * 4}
    assert rare_questions(base) == ["q1", "q2"]
    solve = {"q1": [1.0] * 4, "q2": [1.0, 0.0, 0.0, 0.0], "q3": [0.0] * 4, "q4": [1.0] * 4}  # Avg 0.5625
    runs = {("grpo", 0): base, ("exgrpo", 0): solve, ("grpo", 1): base, ("exgrpo", 1): base}
    records = sweep_heldout(_sweep(tmp_path, runs), base)
    by = {(r["variant"], r["seed"]): r for r in records}
    assert by["grpo", 0]["heldout"] == pytest.approx(0.4375)  # (0.25 + 0.5 + 0 + 1) / 4
    assert by["exgrpo", 0]["heldout"] == pytest.approx(0.5625)
    assert by["exgrpo", 0]["rare"] == pytest.approx(0.625) and by["grpo", 0]["rare"] == pytest.approx(0.375)
    assert by["exgrpo", 1]["tokens"] == 1001
    base_file = tmp_path / "base.jsonl"
    _completions(base_file, base)
    assert main([str(tmp_path / "sweep"), "--base", str(base_file), "--json", str(tmp_path / "h.json")]) == 0
    out = capsys.readouterr().out
    assert "k = 0..n: 1, 1, 1, 0, 1; rare successes (k in (1, 2)): 2 questions" in out
    assert "| exgrpo - grpo | heldout | 2 | +0.062 ± 0.062 | +0.125 +0.000 |" in out
    assert "| exgrpo - grpo | rare | 2 | +0.125 ± 0.125 | +0.250 +0.000 |" in out
    assert (
        json.loads((tmp_path / "h.json").read_text())[str(tmp_path / "sweep")]["contrasts"][0]["seeds"] == 2
    )


def test_a_run_not_evaluated_or_on_other_questions_is_refused(tmp_path):
    sweep = _sweep(tmp_path, {("grpo", 0): {"q1": [1.0]}, ("exgrpo", 0): {"q1": [0.0]}})
    with pytest.raises(ValueError, match="not the base's"):
        sweep_heldout(sweep, {"q2": [1.0]})
    (sweep / "grpo-seed0" / "heldout.jsonl").unlink()
    with pytest.raises(FileNotFoundError, match="evaluate the run first"):
        sweep_heldout(sweep)
