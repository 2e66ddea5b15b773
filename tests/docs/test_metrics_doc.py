"""docs/metrics.md against `exgrpo/core/metric_names.py`: every metric name constant has a row in the page's
table of keys, and every key the table documents is a constant's value (a template such as
`replay/bucket_{k}` is written `replay/bucket_<k>` on the page)."""

from __future__ import annotations

import re
from pathlib import Path

from exgrpo.core import metric_names

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "metrics.md"


def constants() -> dict[str, str]:
    """Each metric name as the page writes it -> the constant that holds it."""
    return {
        re.sub(r"\{(\w+)\}", r"<\1>", value): name
        for name, value in vars(metric_names).items()
        if name.isupper() and isinstance(value, str)
    }


def documented(text: str) -> list[str]:
    """The keys of the page's first table (the one of metrics.jsonl): the backticked names of each row's
    first cell, which may hold several (`learner/loss`, `learner/pg_loss`)."""
    table = text.split("| key | meaning |", 1)[1].split("\n\n", 1)[0]
    keys = []
    for row in table.splitlines()[2:]:
        first = row.split("|")[1]
        keys += re.findall(r"`([^`]+)`", first)
    return keys


def test_every_metric_name_is_documented_and_every_documented_key_is_a_metric_name():
    names = constants()
    keys = documented(PAGE.read_text())
    undocumented = [f"{const} = {key!r}" for key, const in names.items() if key not in keys]
    unknown = [key for key in keys if key not in names]
    assert len(names) > 60 and len(keys) > 60  # the parse found the constants and the table
    assert not undocumented, "in exgrpo/core/metric_names.py, not in docs/metrics.md: " + ", ".join(
        undocumented
    )
    assert not unknown, "in docs/metrics.md, not a constant of exgrpo/core/metric_names.py: " + ", ".join(
        unknown
    )
    assert len(keys) == len(set(keys)), "documented twice: " + ", ".join(
        {k for k in keys if keys.count(k) > 1}
    )
