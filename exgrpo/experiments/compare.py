"""ExGRPO vs on-policy GRPO and the paper's ablations, several seeds each, on the embedded task.

    python -m exgrpo.experiments.compare --variants exgrpo grpo --seeds 0 1 2 --out runs/compare
    python -m exgrpo.experiments.compare --report runs/compare  # tables and curves from results.json only

Runs go one after another through `exgrpo.runtime.recipe.train` in one Ray cluster; every run of a seed sees the
same questions in the same order, so runs are paired by seed. Writes results.json (resumable per seed), table.md,
curves.png and mechanism.png into --out. More: docs/results.md ("Reproduce").
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from exgrpo.experiments.tables import backfill_series, format_report, plot, plot_mechanism, series_of

log = logging.getLogger("exgrpo.compare")
ID, OOD = "eval/accuracy_scratchpad_id", "eval/accuracy_scratchpad_ood"

# name -> (overrides, what it tests); the paper's Table 1 (ExGRPO vs on-policy) and its ablations
VARIANTS: dict[str, tuple[list[str], str]] = {
    "exgrpo": ([], "ExGRPO: rho = 0.5 from replay, Gaussian buckets, lowest-entropy trajectory, shaping"),
    "grpo": (["replay.enabled=false"], "on-policy GRPO (Dr.GRPO advantages, clipped), no replay"),
    "uniform-buckets": (
        ["replay.question_selection=uniform"],
        "no question selection (uniform over buckets)",
    ),
    "random-trajectory": (
        ["replay.trajectory_selection=random"],
        "no trajectory selection (random stored one)",
    ),
    "highest-entropy": (["replay.trajectory_selection=highest_entropy"], "highest-entropy trajectory"),
    "no-shaping": (["loss.policy_shaping=false"], "replayed tokens use the plain ratio w (no w/(w+beta))"),
    "rho-0.25": (["replay.rho=0.25"], "a quarter of each batch from replay"),
    "rho-0.75": (["replay.rho=0.75"], "three quarters of each batch from replay"),
    # the paper's weak-model setting (Llama) replays from the first step: no delayed start
    "exgrpo-weak": (
        ["model.path=builtin:scratchpad-weak", "replay.start_solve_ratio=0.0"],
        "ExGRPO on the weak base model, no delayed start",
    ),
    "grpo-weak": (
        ["model.path=builtin:scratchpad-weak", "replay.enabled=false"],
        "GRPO on the weak base model",
    ),
    # why replay hurts: one change at a time, each against grpo on the same seeds
    "questions-only": (
        ["replay.replay_trajectories=false"],
        "replay the chosen questions with K fresh rollouts, no stored trajectory (the curriculum alone)",
    ),
    "age-2": (
        ["replay.max_age=2"],
        "stored trajectories at most 2 policy versions old (else K fresh rollouts)",
    ),
    "beta-1": (["loss.beta=1.0"], "policy shaping f(w) = w/(w+1) instead of beta = 0.1"),
    "exgrpo-clip-official": (
        ["learners.grad_clip=0.015625", "learners.skip_grad_norm=7.8125"],
        "ExGRPO with grad clip 1.0 and skip 500 in the official units (x 1/64, like the entropy coefficient)",
    ),
    "grpo-clip-official": (
        ["replay.enabled=false", "learners.grad_clip=0.015625", "learners.skip_grad_norm=7.8125"],
        "GRPO with the same rescaled clip and skip thresholds",
    ),
    # which channel carries replay (docs/results.md): beta = 100 keeps the stored row in its group's mean (the
    # baseline shift) and scales its own gradient by w f'(w) = beta w / (w + beta)^2 ~ 0.01 instead of 0.083
    "beta-100": (["loss.beta=100.0"], "the stored row's own gradient ~0, its place in the group mean kept"),
    # rare successes: the Gaussian centred on harder buckets, and with more weight on the stored row
    "mu-2": (["replay.mu=2.0"], "ExGRPO with the bucket weights centred on k = 2 (rarely solved questions)"),
    "mu-2-beta-1": (["replay.mu=2.0", "loss.beta=1.0"], "mu = 2 and shaping f(w) = w/(w+1)"),
    # beyond the paper: replay fills the slots that fresh groups without signal would take
    "zero-var-rho": (
        ["replay.rho_mode=zero_variance", "replay.rho=0.75"],
        "replay share = the last step's share of all-equal fresh groups (at most 0.75) instead of 0.5",
    ),
    # where replay might pay
    "equal-fresh": (
        ["trainer.questions_per_step=16", "data.fresh_per_step=8"],
        "ExGRPO with grpo's 8 fresh questions per step plus up to 8 replayed (equal fresh data, 2x batch)",
    ),
}
SEEDS = [0, 1, 2]  # the default seeds of a sweep
# every run also measures where its gradient comes from (learners.diagnostics.gradient_shares; no effect on training)
DIAGNOSTICS = ["learners.grad_share_every=5"]


def run_overrides(name: str, seed: int, overrides: list[str], out: Path) -> list[str]:
    """Every override of one run of the sweep: the diagnostics, the user's, the variant's, its seed and dir."""
    return [
        *DIAGNOSTICS,
        *overrides,
        *VARIANTS[name][0],
        f"trainer.seed={seed}",
        f"logging.run_dir={out / f'{name}-seed{seed}'}",
        "logging.progress=false",
        "logging.plots=false",
        "logging.ray_metrics=false",
    ]


def set_aside(run_dir: Path) -> Path | None:
    """Move the directory of a run that an earlier invocation started and did not finish (no result in
    results.json; its runs keep no checkpoint to resume from) to `<run_dir>.interrupted[-N]`, kept and said, so
    the run starts again in an empty directory. Returns where it went (None: there was none)."""
    if not run_dir.exists():
        return None
    n, aside = 1, run_dir.with_name(run_dir.name + ".interrupted")
    while aside.exists():
        n += 1
        aside = run_dir.with_name(f"{run_dir.name}.interrupted-{n}")
    run_dir.rename(aside)
    log.info("%s: an unfinished run of an earlier invocation, moved to %s; running it again", run_dir, aside)
    return aside


def run_one(
    name: str, seed: int, overrides: list[str], out: Path, *, config: str | None = None
) -> dict[str, Any]:
    from exgrpo.core.config_files import load_config
    from exgrpo.runtime.recipe import train

    every = run_overrides(name, seed, overrides, out)
    run_dir = out / f"{name}-seed{seed}"
    set_aside(run_dir)
    result = train(load_config(config, every), checkpoints=False)
    records = result.records
    tokens = np.cumsum([0] + [r["rollout/tokens"] for r in records])  # tokens[v]: generated before version v
    curve = [
        {
            "step": int(e["eval/version"]),
            "tokens": int(tokens[int(e["eval/version"])]),
            "all": e["eval/accuracy"],
            "id": e.get(ID),
            "ood": e.get(OOD),
        }
        for e in result.evals
    ]
    chosen = [r["replay/chosen_valid_frac"] for r in records if "replay/chosen_valid_frac" in r]
    return {
        "variant": name,
        "seed": seed,
        "config": config,
        "overrides": every,
        "run_dir": str(run_dir),
        "wall_s": result.wall_s,
        "curve": curve,
        "replay_groups": int(sum(r.get("replay/n_replay", 0) for r in records)),
        "chosen_valid_frac": float(np.mean(chosen)) if chosen else None,
        "final_reward": records[-1].get("rollout/mean_reward"),
        "series": series_of(records),
        "retired": records[-1].get("replay/retired"),
    }


def _checked_inputs(args: argparse.Namespace, out: Path) -> list[dict[str, Any]]:
    """The sweep's earlier results (`out/results.json`, resumable), after checking that every run's config
    loads; raises ValueError (a ConfigError, or a results file that is not a sweep's) naming the problem."""
    from exgrpo.core.config_files import load_config

    path = out / "results.json"
    if args.report and not path.is_file():
        raise ValueError(f"--report {args.report}: no results.json there (run a sweep with --out first)")
    if not args.report:
        for seed in args.seeds:
            for name in args.variants:
                load_config(args.config, run_overrides(name, seed, list(args.overrides), out))
    if not path.exists():
        return []
    try:
        results = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{path} is not a sweep's results file: {err}") from err
    if not isinstance(results, list) or not all(isinstance(r, dict) and "variant" in r for r in results):
        raise ValueError(f"{path} is not a sweep's results file (a list of runs with a 'variant' each)")
    return results


def main(argv: list[str] | None = None) -> int:
    width = max(len(name) for name in VARIANTS)
    parser = argparse.ArgumentParser(
        prog="python -m exgrpo.experiments.compare",
        description=__doc__.split("\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,  # keeps the variant list's lines
        epilog="variants (--variants NAME ...):\n"
        + "\n".join(f"  {name:<{width}}  {what}" for name, (_, what) in VARIANTS.items()),
    )
    parser.add_argument(
        "--variants",
        nargs="+",
        default=list(VARIANTS),
        choices=list(VARIANTS),
        metavar="NAME",
        help="variants to run, listed below (default: all of them)",
    )
    parser.add_argument(
        "--seeds",
        nargs="+",
        type=int,
        default=SEEDS,
        help=f"seeds of every variant (default: {' '.join(map(str, SEEDS))})",
    )
    parser.add_argument(
        "--out", default="runs/compare", help="directory of the runs and the tables (default: %(default)s)"
    )
    parser.add_argument(
        "--report", metavar="DIR", help="only write table.md and curves.png from DIR/results.json"
    )
    parser.add_argument(
        "--config",
        metavar="FILE_OR_NAME",
        help="base config of every run (a YAML file or a packaged config name, e.g. paper-regime; "
        "default: the embedded default); the variant's and the command line's overrides apply on top",
    )
    parser.add_argument("overrides", nargs="*", help="dotted overrides applied to every run")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    out = Path(args.report or args.out)
    try:  # bad input fails here, before any directory, run or Ray cluster exists
        results = _checked_inputs(args, out)
    except ValueError as err:  # ConfigError; a results.json that is not a sweep's
        print(f"error: {err}", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    results_path = out / "results.json"
    backfill_series(results)
    t0 = time.perf_counter()
    if not args.report:
        from exgrpo.core.config_files import load_config
        from exgrpo.runtime.env import init_ray

        init_ray(load_config(args.config, args.overrides))
        done = {(r["variant"], r["seed"]) for r in results}
        for seed in args.seeds:  # seeds outermost: a partial sweep still compares every variant
            for name in args.variants:
                if (name, seed) in done:
                    continue
                log.info("run %s seed %d", name, seed)
                results.append(run_one(name, seed, list(args.overrides), out, config=args.config))
                results_path.write_text(json.dumps(results, indent=1))  # resumable sweep
                (out / "table.md").write_text(format_report(results))
    (out / "table.md").write_text(format_report(results))
    plot(results, out / "curves.png")
    if any(r.get("series") for r in results):
        plot_mechanism(results, out / "mechanism.png")
    print(format_report(results))
    print(f"sweep wall time this invocation: {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
