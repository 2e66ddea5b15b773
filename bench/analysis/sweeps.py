"""The command line the sweep analyses share: a parser over compare sweep directories (each holding the
results.json that `python -m exgrpo.experiments.compare` writes) and the refusal of one that holds none."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def sweeps_parser(prog: str, doc: str | None) -> argparse.ArgumentParser:
    """A parser taking one or more compare sweep directories (each holding results.json)."""
    parser = argparse.ArgumentParser(prog=prog, description=(doc or "").split("\n")[0])
    parser.add_argument(
        "sweeps", nargs="+", type=Path, help="compare sweep directories (holding results.json)"
    )
    return parser


def refuse_missing(sweeps: list[Path]) -> bool:
    """Print an error and return True when a sweep directory holds no results.json."""
    missing = [str(s) for s in sweeps if not (s / "results.json").is_file()]
    if missing:
        print(f"error: no results.json in {', '.join(missing)}", file=sys.stderr)
    return bool(missing)


def run_dir_of(sweep: Path, record: dict) -> Path:
    """The run directory of one results.json record: its `run_dir` as written (relative to where compare ran, so
    also tried under each folder above the sweep), else the directory of that name inside the sweep (a moved
    sweep). Raises when none exists, so that an analysis never reads a missing run as a run that did nothing."""
    written = Path(record["run_dir"])
    above = [] if written.is_absolute() else [a / written for a in sweep.resolve().parents]
    for candidate in (written, *above, sweep / written.name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(
        f"the run directory of {record.get('variant')} seed {record.get('seed')} is neither {written} "
        f"(as results.json has it) nor {sweep / written.name}: run the analysis from where compare ran"
    )
