"""Every command line under arbitrary flags and overrides: a clear error and exit code 2 (0 when the
arguments happen to be valid), never a traceback, and nothing written where it runs.

`run` is fuzzed with `--dry-run` (so a valid draw prints its plan instead of training), `compare` with one
override that never loads (so no sweep starts), `evaluate` with model paths that do not exist and `scale`
against an address where nothing listens.
"""

from __future__ import annotations

import contextlib
import io
import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from exgrpo import evaluate, run, scale
from exgrpo.experiments import compare

SECTIONS = [
    "model",
    "data",
    "reward",
    "samplers",
    "replay",
    "learners",
    "loss",
    "async",
    "trainer",
    "logging",
]
KEYS = ["steps", "rho", "num", "lr", "fn", "train", "path", "zero_stage", "lora_rank", "samples_every", "x"]
VALUES = ["", "-1", "0", "1e9", "nan", "abc", "[1, 2]", "{a: 1}", "true", "null", "1:2", "builtin:nope", "'"]
FLAGS = [
    "--config",
    "--resume",
    "--print-config",
    "--dashboard",
    "--verbose",
    "--help-config",
    "--bogus",
    "-h",
]

override = st.builds(
    lambda sec, key, value: f"{sec}.{key}={value}",
    st.sampled_from([*SECTIONS, "nope"]) | st.text(max_size=6),
    st.sampled_from(KEYS) | st.text(max_size=6),
    st.sampled_from(VALUES) | st.text(max_size=12),
)
word = st.text(alphabet=st.characters(blacklist_categories=["Cs"], blacklist_characters="\x00"), max_size=16)
argv = st.lists(st.sampled_from(FLAGS) | override | word, max_size=6)

FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def _exit_code(main, args: list[str]) -> int:
    """main(args) as the shell sees it: its return value, or argparse's SystemExit code."""
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        try:
            return main(args)
        except SystemExit as done:
            return done.code if isinstance(done.code, int) else 2


@pytest.fixture()
def empty_cwd(monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    with tempfile.TemporaryDirectory() as d:
        monkeypatch.chdir(d)
        yield Path(d)


def _nothing_written(where: Path) -> None:
    assert list(where.iterdir()) == [], os.listdir(where)


@FUZZ
@given(args=argv)
def test_run(empty_cwd, args):
    assert _exit_code(run.main, ["--dry-run", *args]) in (0, 2)
    _nothing_written(empty_cwd)


@FUZZ
@given(args=argv)
def test_compare(empty_cwd, args):
    out = io.StringIO()  # help goes to stdout; a usage error to stderr
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        try:
            code = compare.main([*args, "trainer.steps=-1"])
        except SystemExit as done:
            code = done.code if isinstance(done.code, int) else 2
    # -h exits 0 once argparse reaches it (`--config -h` is a missing config value instead: exit 2)
    helped = "-h" in args and out.getvalue().startswith("usage:")
    assert code == (0 if helped else 2)
    _nothing_written(empty_cwd)


@FUZZ
@given(args=argv, model=word)
def test_evaluate(empty_cwd, args, model):
    code = _exit_code(evaluate.main, [*args, "--model", f"./missing/{model}", "--data", "builtin:arith"])
    assert code == (0 if "-h" in args else 2)
    _nothing_written(empty_cwd)


@FUZZ
@given(args=st.lists(st.sampled_from(["--samplers", "--address", "0", "3", "-2", "x"]) | word, max_size=4))
def test_scale(empty_cwd, args):
    assert _exit_code(scale.main, [*args, "--address", "127.0.0.1:1"]) == 2


def test_the_known_bad_inputs_name_their_fix(empty_cwd, capsys):
    with pytest.raises(SystemExit) as done:  # before the model loads
        evaluate.main(["--model", "builtin:tiny", "--data", "builtin:arith", "--n", "0"])
    assert done.value.code == 2 and "--n must be >= 1" in capsys.readouterr().err
    assert compare.main(["--report", "nowhere"]) == 2
    assert "no results.json there" in capsys.readouterr().err
    (empty_cwd / "sweep").mkdir()
    (empty_cwd / "sweep" / "results.json").write_text("{not json")
    assert compare.main(["--out", "sweep", "--variants", "grpo", "--seeds", "0"]) == 2
    assert "is not a sweep's results file" in capsys.readouterr().err
    assert compare.main(["replay.rhoo=1", "--variants", "grpo"]) == 2
    assert "did you mean 'rho'" in capsys.readouterr().err
    assert sorted(p.name for p in empty_cwd.iterdir()) == ["sweep"]  # nothing else made
