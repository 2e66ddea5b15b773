"""figure1's command line: clear errors without candidates, the tables from a candidates log, its defaults in
`--help`, and under arbitrary arguments an exit code of 0 or 2, never a traceback."""

from __future__ import annotations

import contextlib
import io
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench.analysis.figure1 import main


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


def test_help_shows_the_defaults(capsys):
    with pytest.raises(SystemExit) as done:
        main(["--help"])
    assert done.value.code == 0
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines at the terminal width
    assert "(default: 5)" in text and "(default: print only)" in text


word = st.text(alphabet=st.characters(blacklist_categories=["Cs"], blacklist_characters="\x00"), max_size=16)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(args=st.lists(st.sampled_from(["--bins", "--out", "3", "0", "-1", "x"]) | word, max_size=5))
def test_arbitrary_arguments_exit_0_or_2(tmp_path, monkeypatch, args):
    monkeypatch.chdir(tmp_path)
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        try:
            code = main(args)
        except SystemExit as stop:
            code = stop.code if isinstance(stop.code, int) else 2
    assert code in (0, 2)
