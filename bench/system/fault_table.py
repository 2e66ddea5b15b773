"""Print the fault matrix's measured rows as a markdown table.

    EXGRPO_FAULT_TABLE=DIR python -m pytest tests/integration/test_fault_matrix.py -m slow
    python -m bench.system.fault_table DIR [--json OUT.json]

Each row is one cell of tests/integration/test_fault_matrix.py: which actor died at which named moment
(`exgrpo.core.faults.POINTS`), what the run did, what was lost, and the cell's seconds on this machine.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from bench.common import write_json

ORDER = ("sampler", "shard", "learner", "controller")


def rows(directory: Path) -> list[dict]:
    found = [json.loads(p.read_text()) for p in sorted(directory.glob("*.json"))]
    return sorted(found, key=lambda r: (ORDER.index(r["kind"]), r["fault"]))


def outcome(row: dict) -> str:
    if row.get("outcome") == "survives":
        how = {
            "sampler": "sampler replaced",
            "shard": "shard restarted by Ray, log replayed",
            "controller": "a new controller started with the last count",
        }.get(row["kind"], "?")
        return f"run goes on ({how}); all {row.get('steps', '?')} steps, batches = unkilled run"
    if row.get("outcome") == "interrupted":
        return (
            f"RunInterrupted at step {row.get('died_at_step', '?')} naming {row.get('checkpoint', '?')} and "
            "`--resume`; the resumed run finishes = unkilled run"
        )
    return str(row.get("outcome"))


def lost(row: dict) -> str:
    if row.get("outcome") == "interrupted" and "died_at_step" in row:
        start = int(row["checkpoint"].split("-")[-1])
        return (
            f"whatever was done since {row['checkpoint']}: steps {start}.. are trained again after `--resume`"
        )
    return str(row.get("lost", "not measured (the cell failed)"))


def markdown(found: list[dict]) -> str:
    lines = [
        "| what dies | at (fault point) | what happens | what is lost | cell s |",
        "|---|---|---|---|---|",
    ]
    for r in found:
        point = r["fault"].split(":")[-1]
        lines.append(
            f"| {r['died']} | `{point}`: {r['where'].split(': ', 1)[-1]} | {outcome(r)} | "
            f"{lost(r)} | {r.get('total_s', '?')} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("directory", type=Path)
    ap.add_argument("--json", type=Path, default=None, help="also write the rows as one JSON list")
    args = ap.parse_args(argv)
    found = rows(args.directory)
    if not found:
        print(f"no rows under {args.directory}", file=sys.stderr)
        return 1
    if args.json is not None:
        write_json(args.json, found, indent=1)
    print(markdown(found))
    return 0


if __name__ == "__main__":
    sys.exit(main())
