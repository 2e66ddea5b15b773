"""The sweep analyses of bench/analysis/ on hand-made sweep and run directories: the probe's differences against
grpo, the replay's reach (from candidates.jsonl, or from the replay WAL without one) and a regime table row."""

from __future__ import annotations

import json

import pytest

from bench.analysis.probe import format_probe
from bench.analysis.reach import replayed_from_wal, run_reach
from bench.analysis.regimes import cell_row, format_rows


def _run(variant: str, seed: int, final_id: float) -> dict:
    """One compare record as results.json holds it: its curve at steps 0 and 100 and the fresh no-signal share."""
    curve = [
        {"step": 0, "tokens": 0, "all": 0.2, "id": 0.3, "ood": 0.1},
        {"step": 100, "tokens": 1000, "all": final_id / 2, "id": final_id, "ood": 0.1},
    ]
    series = {"fresh_zero_var": [0.3, 0.5]}
    return {"variant": variant, "seed": seed, "wall_s": 1.0, "curve": curve, "series": series}


def test_probe_report_differences_against_grpo():
    records = [
        {"variant": v, "seed": s, "eval@0.6": {"all": x + s}, "replayed": x}
        for v, x in (("grpo", 0.5), ("exgrpo", 0.4))
        for s in (0, 1)
    ]
    text = format_probe(records)
    assert "| exgrpo − grpo | 2 | -0.100 ± 0.000 | -0.100 ± 0.000 |" in text


def test_reach_reads_replays_ages_ratios_and_buckets_from_a_run_directory(tmp_path):
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
    runs = []
    for s, (ex, gr) in enumerate(((0.50, 0.45), (0.48, 0.47), (0.52, 0.46))):
        for variant, final_id in (("exgrpo", ex), ("grpo", gr)):
            run = _run(variant, s, final_id)
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


def test_rare_successes_follow_each_question_from_its_first_group_to_its_last(tmp_path):
    import pyarrow as pa

    from bench.analysis.reach import groups_from_wal, rare_successes
    from buffers.wal import WriteAheadLog

    wal = WriteAheadLog(tmp_path / "replay-wal" / "0")
    wal.open()
    rows: list[tuple[int, str, str, str, float]] = []  # request, qid, kind, role, reward
    rows += [(1, "q1", "fresh", "trajectory", r) for r in (1.0, 0.0, 0.0, 0.0)]  # rare: 1 of 4
    rows += [(2, "q2", "fresh", "trajectory", r) for r in (1.0, 1.0, 0.0, 0.0)]  # rare: 2 of 4
    rows += [(3, "q3", "fresh", "trajectory", r) for r in (1.0, 1.0, 1.0, 0.0)]  # not rare
    rows += [(4, "q4", "fresh", "trajectory", 0.0) for _ in range(4)]  # never solved: not rare
    # q1 asked again twice: the last group (request 6) solves 2 of 3; the stored candidate's reward is not counted
    rows += [(5, "q1", "replay", "candidate", 1.0)] + [
        (5, "q1", "replay", "trajectory", 0.0) for _ in range(3)
    ]
    rows += [(6, "q1", "replay", "candidate", 1.0)] + [
        (6, "q1", "replay", "trajectory", r) for r in (1, 1, 0)
    ]
    rid, qid, kind, role, reward = zip(*rows, strict=True)
    table = pa.table({"request_id": rid, "qid": qid, "kind": kind, "role": role, "reward": reward})
    wal.append(table.replace_schema_metadata({b"exgrpo.op": b"push"}))
    groups = groups_from_wal(tmp_path)
    assert groups["q1"] == [("fresh", 1, 4), ("replay", 0, 3), ("replay", 2, 3)]
    assert rare_successes(groups) == {
        "asked_again": 1,
        "rare": 2,
        "rare_revisited": 1,
        "rare_later_solved": 1,
    }
    assert set(rare_successes({}).values()) == {None}


def test_a_sweeps_run_directories_resolve_from_elsewhere_and_a_missing_one_raises(tmp_path):
    from bench.analysis.sweeps import run_dir_of

    sweep = tmp_path / "runs" / "sweeps" / "a"
    (sweep / "grpo-seed0").mkdir(parents=True)
    (tmp_path / "runs" / "sweeps" / "b" / "exgrpo-seed0").mkdir(parents=True)
    # written relative to where compare ran (tmp_path), read from another directory
    assert (
        run_dir_of(sweep, {"run_dir": "runs/sweeps/b/exgrpo-seed0"})
        == tmp_path / "runs/sweeps/b/exgrpo-seed0"
    )
    assert run_dir_of(sweep, {"run_dir": "/moved/away/grpo-seed0"}) == sweep / "grpo-seed0"  # a moved sweep
    with pytest.raises(FileNotFoundError, match="exgrpo seed 3"):
        run_dir_of(sweep, {"run_dir": "runs/sweeps/a/exgrpo-seed3", "variant": "exgrpo", "seed": 3})
