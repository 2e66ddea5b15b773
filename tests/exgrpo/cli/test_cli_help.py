"""`--help` of the evaluation and experiment command lines shows every option's default (and compare's
variants, from its variant table)."""

from __future__ import annotations

import pytest

from exgrpo import evaluate
from exgrpo.experiments import compare


def _help(main, capsys) -> str:
    with pytest.raises(SystemExit) as done:
        main(["--help"])
    assert done.value.code == 0
    return " ".join(capsys.readouterr().out.split())  # argparse wraps lines at the terminal width


def test_evaluate_help_shows_the_defaults(capsys):
    text = _help(evaluate.main, capsys)
    assert "--n N samples per question for Avg@n and Pass@n (default: 32)" in text
    assert "(default: 1.0, the run's" in text and "(default: ~/.cache/exgrpo)" in text
    assert f"(default: {evaluate.DEFAULT_MAX_TOKENS}," in text
    optional = [a for a in evaluate._parser()._actions if a.option_strings and not a.required]
    missing = [a.dest for a in optional if "(default: " not in (a.help or "")]
    assert missing == ["help", "model", "data", "like_run"]  # required unless --like-run gives them


def test_compare_help_lists_the_variants_and_defaults(capsys):
    text = _help(compare.main, capsys)
    for name, (_, what) in compare.VARIANTS.items():
        assert f" {name} {' '.join(what.split())}" in text, name
    assert "(default: 0 1 2)" in text and "(default: runs/compare)" in text
    assert "--variants NAME [NAME ...] variants to run, listed below (default: all of them)" in text
