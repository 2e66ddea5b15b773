"""figure1's command line: clear errors without candidates, the tables from a candidates log."""

from __future__ import annotations

import json

from exgrpo.experiments.figure1 import main


def test_runs_without_candidates_are_refused_with_the_reason(tmp_path, capsys):
    assert main([str(tmp_path)]) == 2
    assert "candidates.jsonl not found" in capsys.readouterr().err
    (tmp_path / "candidates.jsonl").write_text("\n")
    assert main([str(tmp_path)]) == 2
    assert "replay never chose among stored trajectories" in capsys.readouterr().err
    (tmp_path / "candidates.jsonl").write_text("not json\n")
    assert main([str(tmp_path)]) == 2
    assert capsys.readouterr().err.startswith("error:")


def test_the_tables_of_a_candidates_log(tmp_path, capsys):
    rows = [  # one informative group (valid low-entropy, flawed high-entropy) and one all-valid group
        {"step": 1, "request_id": 7, "entropy": 0.1, "valid": True},
        {"step": 1, "request_id": 7, "entropy": 0.9, "valid": False},
        {"step": 2, "request_id": 9, "entropy": 0.5, "valid": True},
        {"step": 2, "request_id": 9, "entropy": 0.6, "valid": True},
    ]
    (tmp_path / "candidates.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "fig.json"
    assert main([str(tmp_path), "--bins", "2", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "4 correct candidates scored, 0.750 with a fully valid trace" in printed
    result = json.loads(out.read_text())
    assert result["rules"]["informative"] == 1
    assert result["rules"]["lowest_entropy"] == 1.0 and result["rules"]["highest_entropy"] == 0.0
    assert sum(b["n"] for b in result["bins"]) == 4
