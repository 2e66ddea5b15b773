"""`python -m exgrpo.run`: the training job's command line (its wiring: `exgrpo.runtime.recipe.train`).

    python -m exgrpo.run                                  # embedded default (configs/default.yaml)
    python -m exgrpo.run --config configs/tiny-cpu.yaml trainer.steps=5
    python -m exgrpo.run --print-config | --dry-run [--resume runs/<id>]
    python -m exgrpo.run --help-config [section]          # every setting: type, default, range, meaning
    python -m exgrpo.run --dashboard                      # the Ray dashboard on 127.0.0.1 (its URL is printed)
    python -m exgrpo.run --verbose                        # the actors' own progress bars and warnings too
    python -m exgrpo.run logging.backends=[tensorboard,wandb]   # + TensorBoard and (offline) W&B
    python -m exgrpo.run --resume runs/<id> [trainer.steps=40]
    ray job submit --address http://127.0.0.1:8275 --working-dir . -- python -m exgrpo.run --config tiny-cpu

With RAY_ADDRESS set (as under `ray job submit`) it attaches to that cluster, otherwise it starts
a local one.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path
from typing import Any

from exgrpo.core.config import Config, ConfigError
from exgrpo.core.config_files import load_config

EXAMPLES = """examples:
  python -m exgrpo.run --config tiny-cpu --dry-run     # check a config and its plan, start nothing
  python -m exgrpo.run --config tiny-cpu trainer.steps=5
  python -m exgrpo.run --resume runs/<id> trainer.steps=40
  python -m exgrpo.run --help-config trainer           # every setting of a section

configs: the packaged ones by name (tiny-cpu, length-cpu, ...) or a YAML file; docs: README.md, docs/operating.md
"""


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_intermixed_args(argv)  # overrides may come before or after the options
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    cfg = _config(parser, args)
    if isinstance(cfg, int):  # --help-config, or an error already printed
        return cfg
    if args.print_config:  # a reward given to train(reward_fn=...) by its name, not its cloudpickle spec
        from exgrpo.core.config_display import shown_yaml

        print(shown_yaml(cfg), end="")
        return 0
    from exgrpo.runtime import recipe as launch

    if args.dry_run:
        return _dry_run(cfg, resume=args.resume)
    return _train(launch, cfg, resume=args.resume)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m exgrpo.run",
        description="Train a model with ExGRPO on Ray (a local cluster, or the one at RAY_ADDRESS).",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--config", help="YAML file or packaged config name (default: the embedded default)")
    parser.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="validate, print the placement plan and whether it fits the cluster "
        "(with --resume: check the resume), start nothing",
    )
    parser.add_argument(
        "--help-config",
        nargs="?",
        const="",
        metavar="SECTION",
        help="print the settings reference (every section, or one) and exit (docs/config.md)",
    )
    parser.add_argument(
        "--resume",
        metavar="RUN_DIR",
        help="continue a run from its latest checkpoint "
        "(its config.yaml is used; overrides such as trainer.steps=40 still apply)",
    )
    parser.add_argument(
        "--dashboard",
        action="store_true",
        help="local cluster: start the Ray dashboard on "
        "127.0.0.1 and print its URL (= logging.dashboard=true; docs/operating.md)",
    )
    parser.add_argument(
        "--verbose",
        action="store_true",
        help="let the actors' progress bars, library warnings "
        "and info logs through (= logging.verbose=true; quiet by default)",
    )
    parser.add_argument(
        "overrides", nargs="*", help="dotted overrides, e.g. replay.rho=0.25 trainer.steps=10"
    )
    return parser


def _config(parser: argparse.ArgumentParser, args: argparse.Namespace) -> Config | int:
    """The run's config (its file, --resume's, the flags and overrides); or the exit code when there is none:
    0 after --help-config, 2 after an error (printed)."""
    if args.help_config is not None:
        from exgrpo.core.config_reference import plain_text

        try:
            print(plain_text(args.help_config or None), end="")
        except KeyError as e:
            print(f"error: {e.args[0]}", file=sys.stderr)
            return 2
        return 0
    if args.resume:
        if args.config:
            parser.error(
                "--resume uses the run's own config.yaml; pass changes as overrides instead of --config"
            )
        args.config = str(Path(args.resume) / "config.yaml")
        if not Path(args.config).is_file():
            print(
                f"error: cannot resume {args.resume!r}: "
                f"{'it has no config.yaml' if Path(args.resume).is_dir() else 'no such run directory'} "
                "(give the run directory that `python -m exgrpo.run` printed, e.g. runs/<timestamp>)",
                file=sys.stderr,
            )
            return 2
        args.overrides = [*args.overrides, f"logging.run_dir={args.resume}"]
    args.overrides = [
        *args.overrides,
        *(["logging.dashboard=true"] if args.dashboard else []),
        *(["logging.verbose=true"] if args.verbose else []),
    ]
    try:
        cfg = load_config(args.config, args.overrides)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return cfg


def _dry_run(cfg: Config, *, resume: str | None) -> int:
    """--dry-run: the placement plan, the memory plan, a start's checks before Ray and its cluster fit."""
    from exgrpo.data.readers import DataError
    from exgrpo.loop.checkpoint import ResumeError, fresh_run_dir_check, resume_report
    from exgrpo.models.resolve import ModelResolveError
    from exgrpo.runtime.clusters import dry_run_fit
    from exgrpo.runtime.memory_plan import dry_run_report
    from exgrpo.runtime.preflight import preflight
    from exgrpo.runtime.resources import placement_plan

    print(placement_plan(cfg))
    memory, fits = dry_run_report(cfg)
    if memory:
        print(memory)
    if not fits:
        print("error: the memory plan does not fit (see its fix: lines)", file=sys.stderr)
        return 2
    try:  # what a start checks before Ray: the reward, the model, LoRA's targets, the data
        print("\n".join(preflight(cfg, resume=bool(resume))))
    except (ConfigError, DataError, ModelResolveError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:  # the checks a real start makes before its first actor
        print(dry_run_fit(cfg))
        if resume:
            print(resume_report(Path(resume), cfg))
        else:
            fresh_run_dir_check(cfg)  # a fresh run must not write over another run's checkpoints
    except (ConfigError, ResumeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


def _train(launch: Any, cfg: Config, *, resume: str | None) -> int:
    """The run (`exgrpo.runtime.recipe.train`, `launch`); its exit code: 0, 2 for bad input, 1 when it stopped
    interrupted past its recoveries, 130 after Ctrl-C (at a step boundary: checkpointed)."""
    from exgrpo.data.readers import DataError
    from exgrpo.loop.checkpoint import ResumeError, RunInterrupted, latest_checkpoint
    from exgrpo.models.resolve import ModelResolveError
    from exgrpo.runtime.env import RayStartError
    from exgrpo.runtime.run_dir import self_contained

    made = None
    try:
        if not resume:  # a run directory that works from anywhere: absolute paths, the reward file copied in
            cfg, made = self_contained(cfg)
        result = launch.train(cfg, resume=bool(resume), stop_on_signals=True)
    except (ConfigError, DataError, ModelResolveError, ResumeError, FileNotFoundError, RayStartError) as e:
        # bad input (config, resources, data, model, resume) or Ray did not start: nothing was trained
        if made is not None:  # the run directory made for the reward's copy: a refused start leaves none
            import shutil

            shutil.rmtree(made, ignore_errors=True)
        print(f"error: {e}", file=sys.stderr)
        return 2
    except (
        RunInterrupted
    ) as e:  # a learner, shard or the controller died past trainer.max_failures recoveries
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as e:
        # the second Ctrl-C names the run's directory (a default runs/<time> too); else the configured one
        run_dir = getattr(e, "run_dir", None) or cfg.logging.run_dir
        ckpt = latest_checkpoint(Path(run_dir)) if run_dir else None
        hint = f"; resume from {ckpt} with: python -m exgrpo.run --resume {run_dir}" if ckpt else ""
        print(f"interrupted{hint}", file=sys.stderr)
        return 130
    finally:
        if not os.environ.get("RAY_ADDRESS"):
            import ray

            ray.shutdown()
    return 130 if result.stopped else 0  # Ctrl-C / SIGTERM: stopped at a step boundary, checkpointed


if __name__ == "__main__":
    sys.exit(main())
