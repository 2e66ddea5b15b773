"""Carve a validation split out of a builtin task's train split, for choices that must not see its held-out split.

    .venv/bin/python -m bench.models.validation_split [--task builtin:sum-1digit] [--train 146] [--num 27]
        [--out runs/sum-1digit-validation.parquet]

Writes the `--num` questions after the first `--train` (parquet) for `data.eval=<out>` (docs/benchmarks.md,
"Base models and tasks").
"""

from __future__ import annotations

import argparse
from pathlib import Path


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--task", default="builtin:sum-1digit", help="a builtin task (builtin:<name>)")
    parser.add_argument("--train", type=int, default=146, help="train questions left to data.num_train")
    parser.add_argument("--num", type=int, default=27, help="validation questions written")
    parser.add_argument("--seed", type=int, default=0, help="data.seed of the runs")
    parser.add_argument("--out", default="runs/sum-1digit-validation.parquet")
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    import pyarrow as pa
    import pyarrow.parquet as pq

    from exgrpo.data.sources import read_source

    prompts = read_source(args.task, split="train", num=args.train + args.num, seed=args.seed).prompts
    train, validation = prompts[: args.train], prompts[args.train :]
    assert not {p.question for p in train} & {p.question for p in validation}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(
        pa.table(
            {
                "question": [p.question for p in validation],
                "answer": [p.answer for p in validation],
                "data_source": [p.data_source for p in validation],
            }
        ),
        out,
    )
    print(
        f"{out}: {len(validation)} validation questions ({args.task} train split, questions "
        f"{args.train}..{args.train + len(validation) - 1}); train with data.num_train={args.train} "
        f"data.eval={out}"
    )


if __name__ == "__main__":
    main()
