"""bench.analysis.curves on a hand-made sweep: per-arm means with standard errors, paired differences to the base
arm step by step, the figure, and a clear refusal of a base arm the sweep does not hold."""

from __future__ import annotations

import json

import pytest

from bench.analysis.curves import arm_curves, main, paired_curves


def _run(variant: str, seed: int, accs: list[float]) -> dict:
    curve = [
        {"step": 20 * i, "tokens": 100 * i, "all": a, "id": None, "ood": None} for i, a in enumerate(accs)
    ]
    return {"variant": variant, "seed": seed, "curve": curve}


RESULTS = [
    _run("grpo", 0, [0.2, 0.3]),
    _run("grpo", 1, [0.4, 0.4]),
    _run("exgrpo", 0, [0.2, 0.4]),
    _run("exgrpo", 1, [0.4, 0.6]),
]


def test_arm_means_and_paired_differences_per_step():
    arms = arm_curves(RESULTS)
    step, mean, se, n = arms["grpo"][1]
    assert (step, n) == (20, 2) and mean == pytest.approx(0.35) and se == pytest.approx(0.05)
    diff = paired_curves(RESULTS, "grpo")
    assert list(diff) == ["exgrpo"]
    assert diff["exgrpo"][0][1:3] == pytest.approx((0.0, 0.0))  # the same start for both arms of a seed
    step, mean, se, n = diff["exgrpo"][1]
    assert (step, n) == (20, 2) and mean == pytest.approx(0.15) and se == pytest.approx(0.05)  # +0.1, +0.2


def test_the_figure_and_tables_are_written_and_an_unknown_base_is_refused(tmp_path, capsys):
    (tmp_path / "results.json").write_text(json.dumps(RESULTS))
    assert main([str(tmp_path), "--out", str(tmp_path / "c.png")]) == 0
    assert (tmp_path / "c.png").stat().st_size > 1000
    assert "| exgrpo - grpo | 20 | +0.150 | 0.050 | 2 |" in capsys.readouterr().out
    assert main([str(tmp_path), "--base", "nope"]) == 2
    assert "no 'nope' runs in this sweep" in capsys.readouterr().err
