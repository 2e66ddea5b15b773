"""`python -m exgrpo.run`: the training job's command line (the wiring is `exgrpo.launch.train`).

    python -m exgrpo.run                                  # embedded default (configs/default.yaml)
    python -m exgrpo.run --config configs/tiny-cpu.yaml trainer.steps=5
    python -m exgrpo.run --print-config | --dry-run
    python -m exgrpo.run --resume runs/<id> [trainer.steps=40]
    ray job submit --address http://127.0.0.1:8265 --working-dir . -- python -m exgrpo.run --config tiny-cpu

With RAY_ADDRESS set (as under `ray job submit`) it attaches to that cluster, otherwise it starts
a local one.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from exgrpo.config import ConfigError, load_config


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m exgrpo.run", description=__doc__.split("\n")[0])
    parser.add_argument("--config", help="YAML file or packaged config name (default: the embedded default)")
    parser.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    parser.add_argument("--dry-run", action="store_true", help="validate and print the placement plan, start nothing")
    parser.add_argument("--resume", metavar="RUN_DIR", help="continue a run from its latest checkpoint "
                        "(its config.yaml is used; overrides such as trainer.steps=40 still apply)")
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. replay.rho=0.25 trainer.steps=10")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if args.resume:
        if args.config:
            parser.error("--resume uses the run's own config.yaml; pass changes as overrides instead of --config")
        args.config = str(Path(args.resume) / "config.yaml")
        args.overrides = [*args.overrides, f"logging.run_dir={args.resume}"]
    try:
        cfg = load_config(args.config, args.overrides)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.print_config:
        print(cfg.to_yaml(), end="")
        return 0
    from exgrpo import launch

    if args.dry_run:
        print(launch.placement_plan(cfg))
        return 0
    try:
        launch.train(cfg, resume=bool(args.resume))
    except FileNotFoundError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    finally:
        if not os.environ.get("RAY_ADDRESS"):
            import ray

            ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
