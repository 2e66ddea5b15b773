"""bench/models/heldout_scores.py on hand-made completion files: both scores from one generation, the
per-question histogram, and the gain of a run prefix over the base."""

from __future__ import annotations

import json

from bench.models import heldout_scores
from exgrpo.data.sources import read_source


def _write(path, prompts, right: int, *, boxed: bool) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for p in prompts:
            for j in range(4):
                good = f"\\boxed{{{p.answer}}}" if boxed else f"it is {p.answer}"
                row = {
                    "qid": p.qid,
                    "prompt": p.question,
                    "completion": good if j < right else "99",
                    "sample": j,
                }
                f.write(json.dumps(row) + "\n")


def test_strict_and_lenient_from_one_file_and_the_gain_over_the_base(tmp_path, capsys):
    prompts = read_source("builtin:sum-1digit", split="eval", num=27, seed=0).prompts[:3]
    _write(tmp_path / "base.jsonl", prompts, 1, boxed=False)
    _write(tmp_path / "exgrpo-seed0" / "heldout.jsonl", prompts, 2, boxed=True)
    _write(tmp_path / "exgrpo-seed1" / "heldout.jsonl", prompts, 3, boxed=True)
    heldout_scores.main(
        [
            "--base",
            str(tmp_path / "base.jsonl"),
            str(tmp_path / "exgrpo-seed0" / "heldout.jsonl"),
            str(tmp_path / "exgrpo-seed1" / "heldout.jsonl"),
        ]
    )
    out = capsys.readouterr().out
    assert "base.jsonl  strict   Avg 0.000 ± 0.000  k-histogram [3, 0, 0, 0, 0]" in out  # unboxed: strict 0
    assert "base.jsonl  lenient  Avg 0.250 ± 0.000  k-histogram [0, 3, 0, 0, 0]" in out
    assert "exgrpo: strict gain over the base +0.625 ± 0.125 (2 seeds: +0.500 +0.750)" in out
    assert "exgrpo: lenient gain over the base +0.375 ± 0.125 (2 seeds: +0.250 +0.500)" in out
