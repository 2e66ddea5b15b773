"""`python -m exgrpo.cold_start`: a short supervised cold start from a run config, before RL.

    python -m exgrpo.cold_start --config configs/smollm2-135m-cpu.yaml --out runs/smollm2-cold
    python -m exgrpo.run --config configs/smollm2-135m-cpu.yaml model.path=runs/smollm2-cold

It reads the same config and overrides as the run (so it trains on the run's train prompts only, never on its
held-out or validation questions), resolves `model.path`, fine-tunes it on the builtin task's worked solutions
(`learners/cold_start.py`) and writes an HF model directory that `model.path` accepts. Measured: docs/smollm2.md.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from exgrpo.core.config import ConfigError, builtin_name
from exgrpo.core.config_files import load_config


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m exgrpo.cold_start", description=__doc__.split("\n")[0])
    p.add_argument("--config", help="the run's YAML file or packaged config name")
    p.add_argument("--out", required=True, help="directory to write the fine-tuned model to")
    p.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    p.add_argument("--steps", type=int, default=30, help="optimizer steps (default 30)")
    p.add_argument("--batch-size", type=int, default=8, help="solutions per step (default 8)")
    p.add_argument(
        "--lr", type=float, default=2.0e-5, help="AdamW learning rate, every weight (default 2e-5)"
    )
    p.add_argument("--seed", type=int, default=0, help="data order and initialisation seed (default 0)")
    p.add_argument("overrides", nargs="*", help="the run's dotted overrides, e.g. data.num_train=146")
    return p


def main(argv: list[str] | None = None) -> int:
    from exgrpo.data.sources import load_prompts
    from exgrpo.data.tasks import builtin_task
    from exgrpo.models.resolve import resolve_model
    from learners.cold_start import ColdStartSpec, cold_start

    args = _parser().parse_intermixed_args(argv)
    out = Path(args.out)
    if out.exists() and not args.overwrite:
        print(f"error: {out} exists (pass --overwrite to replace it)", file=sys.stderr)
        return 2
    try:
        cfg = load_config(args.config, args.overrides)
        spec = ColdStartSpec(
            steps=args.steps,
            batch_size=args.batch_size,
            lr=args.lr,
            seed=args.seed,
            autocast=cfg.learners.autocast,
        )
        spec.check()
    except (ConfigError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if builtin_name(cfg.data.train) is None:
        print(
            f"error: the cold start needs worked solutions: data.train must be a builtin task, not "
            f"{cfg.data.train!r}",
            file=sys.stderr,
        )
        return 2
    task = builtin_task(cfg.data.train, seed=cfg.data.seed)
    train, _ = load_prompts(cfg)
    base = resolve_model(cfg.model.path, cache_dir=cfg.model.cache_dir)
    record = cold_start(
        base, out, prompts=train, solution=task.solution_text, template=cfg.model.template, spec=spec
    )
    print(
        f"[exgrpo] cold start done in {record['seconds']} s: loss {record['losses'][0]} -> "
        f"{record['losses'][-1]}; model in {out}"
    )
    config = f"--config {args.config} " if args.config else ""
    print(f"next: python -m exgrpo.run {config}model.path={out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
