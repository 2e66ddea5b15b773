"""The sweep reports are plain functions of results.json: paired differences and the mechanism table (NaN-aware
series means), on hand-made records; the sweep's configuration as the base of every run."""

from __future__ import annotations

import math

import pytest

from exgrpo.experiments.compare import VARIANTS, set_aside
from exgrpo.experiments.tables import (
    format_report,
    mechanism_table,
    paired,
    plot,
    plot_mechanism,
    series_mean,
)


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


def test_a_task_of_one_source_is_compared_on_all_its_held_out_questions(tmp_path):
    results = [_run("grpo", s, 0.5) for s in (0, 1)] + [_run("exgrpo", s, 0.6 + 0.02 * s) for s in (0, 1)]
    for r in results:
        for point in r["curve"]:
            point["id"] = point["ood"] = (
                None  # what compare.run_one records for a task without ID/OOD sources
            )
    table = format_report(results)
    assert "| exgrpo − grpo | 2 | +0.055 ± 0.005 |" in table  # "all": final_id / 2
    assert "### ID" not in table and "final all" in table
    for r in results:
        r["series"] = {"fresh_zero_var": [0.5, 0.4], "entropy": [1.9, 1.7], "train_reward": [0.1, 0.3]}
    plot(results, tmp_path / "curves.png")
    plot_mechanism(results, tmp_path / "mechanism.png")
    assert (tmp_path / "curves.png").stat().st_size > 0 and (tmp_path / "mechanism.png").stat().st_size > 0


def test_mechanism_table_means_series_over_steps_then_seeds_skipping_nan():
    a = _run("exgrpo", 0, 0.5, series={"fresh_zero_var": [0.5, float("nan"), 0.3], "clipped": [1.0, 0.0]})
    b = _run("exgrpo", 1, 0.5, series={"fresh_zero_var": [0.2, None], "clipped": [0.0, 0.0]})
    assert series_mean(a, "fresh_zero_var") == pytest.approx(0.4)
    assert math.isnan(series_mean(a, "share_stored"))
    row = next(line for line in mechanism_table([a, b]) if line.startswith("| exgrpo |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[:3] == ["exgrpo", "2", "0.300"]  # (0.4 + 0.2) / 2
    assert cells[7] == "0.250"  # clipped steps: (0.5 + 0.0) / 2
    assert cells[8] == "-"  # no gradient split measured


def test_compare_config_is_the_base_of_every_run_and_a_bad_one_is_refused(tmp_path, capsys):
    from exgrpo.core.config_files import load_config
    from exgrpo.experiments.compare import main, run_overrides

    cfg = load_config("paper-regime", run_overrides("grpo", 3, ["trainer.steps=7"], tmp_path))
    assert (cfg.learners.minibatches, cfg.async_.max_staleness, cfg.loss.entropy_per) == (2, 0, "micro_batch")
    assert (cfg.data.num_train, cfg.trainer.steps, cfg.trainer.seed) == (400, 7, 3)
    assert not cfg.replay.enabled and not cfg.replay.retires  # the variant on top of the base
    assert load_config("paper-regime", run_overrides("exgrpo", 0, [], tmp_path)).replay.retires
    code = main(
        ["--config", str(tmp_path / "missing.yaml"), "--variants", "grpo", "--out", str(tmp_path / "o")]
    )
    assert code == 2 and "missing.yaml" in capsys.readouterr().err and not (tmp_path / "o").exists()


def test_an_unfinished_runs_directory_is_moved_aside_before_its_run_starts_again(tmp_path):
    run = tmp_path / "grpo-seed0"
    assert set_aside(run) is None
    for n, name in enumerate(("grpo-seed0.interrupted", "grpo-seed0.interrupted-2")):
        run.mkdir()
        (run / "metrics.jsonl").write_text(f'{{"step": {n}}}\n')
        assert set_aside(run) == tmp_path / name and not run.exists()
        assert (tmp_path / name / "metrics.jsonl").read_text() == f'{{"step": {n}}}\n'  # kept as it was
