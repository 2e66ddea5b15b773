"""The ExGRPO paper's evaluation table: `python -m exgrpo.evaluate --model M --paper-table DIR`.

DIR holds the nine evaluation files of `python -m exgrpo.data.benchmarks`. Each is evaluated by
`exgrpo.evaluate` at temperature 0.6 with responses up to 8192 tokens: AIME24, AIME25 and AMC with 32 samples
per question (Avg@32), the rest with one sample at T 0.6 (Pass@1 as the paper samples it). The score of a file
is its Avg@n (mean reward of the samples); the table prints it in percent in the paper's column order.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path

TEMPERATURE = 0.6
MAX_TOKENS = 8192
ID_COLUMNS = (  # (data_source, column heading, samples per question)
    ("aime24", "AIME24", 32),
    ("aime25", "AIME25", 32),
    ("amc", "AMC", 32),
    ("math500", "MATH-500", 1),
    ("minerva", "Minerva", 1),
    ("olympiad_bench", "Olympiad", 1),
)
OOD_COLUMNS = (
    ("arc_c", "ARC-c", 1),
    ("gpqa_diamond", "GPQA", 1),
    ("mmlu_pro", "MMLU-Pro", 1),
)
PAPER_OPTIONS = ("data", "n", "temperature", "max_tokens", "like_run")  # set by the preset; not to be given


def paper_table(scores: Mapping[str, float]) -> str:
    """The table: one header line and one line of percentages (fractions in `scores`, by data_source) in
    the paper's column order, with the in- and out-of-distribution averages; a missing file shows `-` and
    leaves its average out (`-`)."""

    def cell(value: float | None) -> str:
        return "-" if value is None else f"{100 * value:.1f}"

    def average(names: list[str]) -> float | None:
        if not all(n in scores for n in names):
            return None
        return sum(scores[n] for n in names) / len(names)

    heads: list[str] = []
    cells: list[str] = []
    for columns, avg_head in ((ID_COLUMNS, "Avg ID"), (OOD_COLUMNS, "Avg OOD")):
        for name, head, _ in columns:
            heads.append(head)
            cells.append(cell(scores.get(name)))
        heads.append(avg_head)
        cells.append(cell(average([name for name, _, _ in columns])))
    widths = [max(len(h), len(c)) for h, c in zip(heads, cells, strict=True)]
    return "\n".join(
        "  ".join(text.rjust(w) for text, w in zip(line, widths, strict=True)) for line in (heads, cells)
    )


def report_score(report: Mapping[str, object]) -> float:
    """A file's score from `exgrpo.evaluate`'s JSON: its overall Avg@n."""
    overall = report["overall"]
    assert isinstance(overall, dict)
    return float(overall["avg_at_n"])


def run(argv: list[str], data_dir: Path, out_dir: Path, main: Callable[[list[str]], int]) -> int:
    """Evaluates every file of the preset with `main` (`exgrpo.evaluate.main`; `argv`: the other options,
    passed on), writes `out_dir/eval-<name>.json` and `out_dir/paper-table.txt`, prints the table; 2 when a
    file is missing."""
    import sys

    columns = ID_COLUMNS + OOD_COLUMNS
    missing = [f"{name}.parquet" for name, _, _ in columns if not (data_dir / f"{name}.parquet").is_file()]
    if missing:
        print(
            f"error: --paper-table {data_dir}: missing {', '.join(missing)} "
            f"(write them with python -m exgrpo.data.benchmarks --out {data_dir})",
            file=sys.stderr,
        )
        return 2
    out_dir.mkdir(parents=True, exist_ok=True)
    scores: dict[str, float] = {}
    for name, _, n in columns:
        out = out_dir / f"eval-{name}.json"
        options = ["--data", str(data_dir / f"{name}.parquet"), "--n", str(n)]
        options += ["--temperature", str(TEMPERATURE), "--max-tokens", str(MAX_TOKENS), "--out", str(out)]
        print(f"paper table: {name} (n {n}, T {TEMPERATURE}, {MAX_TOKENS} tokens)", file=sys.stderr)
        code = main([*argv, *options])
        if code != 0:
            return code
        scores[name] = report_score(json.loads(out.read_text()))
    table = paper_table(scores)
    (out_dir / "paper-table.txt").write_text(table + "\n")
    print(table)
    return 0
