"""The sweep reports are plain functions of results.json / probe.json: paired differences, the mechanism table
(NaN-aware series means) and the probe's differences against grpo, on hand-made records."""

from __future__ import annotations

import math

import pytest

from exgrpo.experiments.compare import VARIANTS
from exgrpo.experiments.probe import format_probe
from exgrpo.experiments.tables import _series_mean, format_report, mechanism_table, paired


def _run(variant: str, seed: int, final_id: float, *, series: dict | None = None) -> dict:
    curve = [
        {"step": 0, "tokens": 0, "all": 0.2, "id": 0.3, "ood": 0.1},
        {"step": 100, "tokens": 1000, "all": final_id / 2, "id": final_id, "ood": 0.1},
    ]
    return {
        "variant": variant,
        "seed": seed,
        "wall_s": 1.0,
        "curve": curve,
        "replay_groups": 0,
        "chosen_valid_frac": None,
        "series": series or {},
    }


def test_paired_difference_and_its_standard_error():
    m, se, n = paired([0.1, 0.3])
    assert (m, n) == (pytest.approx(0.2), 2) and se == pytest.approx(0.1)


def test_format_report_pairs_questions_only_with_grpo_by_seed():
    results = [_run("grpo", s, 0.5 + 0.01 * s) for s in (0, 1)] + [
        _run("questions-only", s, 0.48 + 0.01 * s) for s in (0, 1)
    ]
    table = format_report(results)
    assert "| questions-only − grpo | 2 | -0.020 ± 0.000 |" in table
    assert "questions-only" in VARIANTS and "equal-fresh" in VARIANTS


def test_mechanism_table_means_series_over_steps_then_seeds_skipping_nan():
    a = _run("exgrpo", 0, 0.5, series={"fresh_zero_var": [0.5, float("nan"), 0.3], "clipped": [1.0, 0.0]})
    b = _run("exgrpo", 1, 0.5, series={"fresh_zero_var": [0.2, None], "clipped": [0.0, 0.0]})
    assert _series_mean(a, "fresh_zero_var") == pytest.approx(0.4)
    assert math.isnan(_series_mean(a, "share_stored"))
    row = next(line for line in mechanism_table([a, b]) if line.startswith("| exgrpo |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[:3] == ["exgrpo", "2", "0.300"]  # (0.4 + 0.2) / 2
    assert cells[7] == "0.250"  # clipped steps: (0.5 + 0.0) / 2
    assert cells[8] == "-"  # no gradient split measured


def test_probe_report_differences_against_grpo():
    records = [
        {"variant": v, "seed": s, "eval@0.6": {"all": x + s}, "replayed": x}
        for v, x in (("grpo", 0.5), ("exgrpo", 0.4))
        for s in (0, 1)
    ]
    text = format_probe(records)
    assert "| exgrpo − grpo | 2 | -0.100 ± 0.000 | -0.100 ± 0.000 |" in text
