"""The sweep reports are plain functions of results.json / probe.json: paired differences, the mechanism table
(NaN-aware series means) and the probe's differences against grpo, on hand-made records."""

from __future__ import annotations

import math

import pytest

from exgrpo.experiments.compare import VARIANTS
from exgrpo.experiments.probe import format_probe
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


def test_probe_report_differences_against_grpo():
    records = [
        {"variant": v, "seed": s, "eval@0.6": {"all": x + s}, "replayed": x}
        for v, x in (("grpo", 0.5), ("exgrpo", 0.4))
        for s in (0, 1)
    ]
    text = format_probe(records)
    assert "| exgrpo − grpo | 2 | -0.100 ± 0.000 | -0.100 ± 0.000 |" in text


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


def test_reach_reads_replays_ages_ratios_and_buckets_from_a_run_directory(tmp_path):
    import json

    from exgrpo.experiments.reach import run_reach

    records = [
        {"step": t, "replay/n_replay": 2 if t else 0, "learner/ratio_replay": 1.0 + 0.1 * t, "replay/retired": t,
         "replay/bucket_1": t, "replay/bucket_2": 5}
        for t in range(4)
    ]  # fmt: skip
    records[2]["learner/ratio_replay"] = None  # logged as null when a step had no replayed token
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in records))
    cands = [  # step 1: q1 (two candidates, the lower entropy one sampled at version 0), q2; step 2: q1 again
        {"step": 1, "request_id": 5, "qid": "q1", "candidate": 0, "entropy": 0.3, "policy_version": 1},
        {"step": 1, "request_id": 5, "qid": "q1", "candidate": 1, "entropy": 0.2, "policy_version": 0},
        {"step": 1, "request_id": 6, "qid": "q2", "candidate": 0, "entropy": 0.5, "policy_version": 1},
        {"step": 2, "request_id": 9, "qid": "q1", "candidate": 0, "entropy": 0.1, "policy_version": 2},
    ]
    (tmp_path / "candidates.jsonl").write_text("\n".join(json.dumps(c) for c in cands))
    reach = run_reach(tmp_path, k_rollouts=3)
    assert reach["replay_groups"] == 6 and reach["distinct_replayed"] == 2
    assert reach["replays_per_question"] == 1.5 and reach["max_replays_of_a_question"] == 2
    assert (reach["age_p50"], reach["age_max"]) == (0.0, 1.0)  # ages 1 (q1 at step 1), 0, 0
    assert reach["ratio_p50"] == pytest.approx(1.2) and reach["ratio_p90"] == pytest.approx(1.28)
    assert reach["retired"] == 3
    assert reach["buckets"] == {"3": "1:3 2:5"}
    # logs with the pick marked (any selection, entropy unscored): the chosen row's age, not the lowest entropy's
    for c in cands:
        c.update(entropy=None, chosen=c["candidate"] == 0)
    (tmp_path / "candidates.jsonl").write_text("\n".join(json.dumps(c) for c in cands))
    reach = run_reach(tmp_path, k_rollouts=3)
    assert (reach["age_p50"], reach["age_max"]) == (0.0, 0.0) and reach["distinct_replayed"] == 2


def test_regime_row_pairs_the_arm_with_grpo_and_reads_the_cell_from_its_config(tmp_path):
    import json

    from exgrpo.experiments.regimes import cell_row, format_rows

    runs = []
    for s, (ex, gr) in enumerate(((0.50, 0.45), (0.48, 0.47), (0.52, 0.46))):
        for variant, final_id in (("exgrpo", ex), ("grpo", gr)):
            run = _run(variant, s, final_id, series={"fresh_zero_var": [0.3, 0.5]})
            runs.append(
                {**run, "config": "paper-regime", "overrides": [f"trainer.seed={s}", "logging.run_dir=x"]}
            )
    (tmp_path / "results.json").write_text(json.dumps(runs))
    row = cell_row(tmp_path, arm="exgrpo", base="grpo")
    assert row is not None and (row["epochs"], row["B"], row["minibatches"], row["eta"]) == (2.0, 8, 2, 0)
    assert row["id"][0] == pytest.approx(0.04) and row["id"][1] == pytest.approx(
        (0.0007**0.5) / 3**0.5, rel=1e-6
    )
    assert row["fresh_zero_var"] == pytest.approx(0.4) and row["seeds"] == 3
    assert "| +0.040 ± 0.015 |" in format_rows([row], arm="exgrpo", base="grpo")
    assert cell_row(tmp_path, arm="beta-100", base="grpo") is None


def test_reach_without_candidates_counts_replay_requests_from_the_replay_wal(tmp_path):
    import pyarrow as pa

    from buffers.wal import WriteAheadLog
    from exgrpo.experiments.reach import replayed_from_wal

    wal = WriteAheadLog(tmp_path / "replay-wal" / "0")
    wal.open()

    def push(rows: list[tuple[int, str, str]]) -> pa.Table:
        rid, qid, kind = zip(*rows, strict=True)
        table = pa.table({"request_id": list(rid), "qid": list(qid), "kind": list(kind)})
        return table.replace_schema_metadata({b"exgrpo.op": b"push"})

    wal.append(
        push([(1, "q1", "fresh"), (2, "q2", "replay"), (2, "q2", "replay")])
    )  # K - 1 rows of one request
    wal.append(pa.table({"request_id": [2]}).replace_schema_metadata({b"exgrpo.op": b"take"}))
    wal.append(push([(3, "q2", "replay"), (4, "q3", "replay")]))
    assert replayed_from_wal(tmp_path) == {"q2": 2, "q3": 1}
