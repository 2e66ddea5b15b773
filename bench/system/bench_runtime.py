"""Runtime figures for issue 3, measured side by side in one local Ray cluster: steps/s and generated tokens/s of
the tiny config per engine (hf, vllm), the per-step split, and the wall time at eta = 0 against eta = 1.

    .venv/bin/python -m bench.system.bench_runtime [--steps 8] [--out bench/out/runtime.json]

Weight-sync time per transport against the memory floor: bench/weights/bench_weight_sync.py.
"""

from __future__ import annotations

import argparse
import json

from bench.common import OUT_DIR, STEP_SPLIT, env_defaults, write_json

env_defaults(ray=True)

import numpy as np  # noqa: E402

from exgrpo.core.config_files import load_config  # noqa: E402
from exgrpo.runtime.env import init_ray  # noqa: E402
from exgrpo.runtime.recipe import train  # noqa: E402


def make_cfg(overrides: list[str]):
    return load_config(
        "tiny-cpu",
        [
            "logging.progress=false",
            "logging.plots=false",
            "trainer.eval_every=0",
            "data.num_eval=0",
            "logging.run_dir=bench/out/run",
            *overrides,
        ],
    )


def train_run(overrides: list[str]) -> dict:
    """2N steps through `exgrpo.runtime.recipe.train`; the first N warm up (engine first calls, DeepSpeed first step)."""
    cfg = make_cfg(overrides)
    n = cfg.trainer.steps
    records = train(make_cfg([*overrides, f"trainer.steps={2 * n}"]), checkpoints=False).records[n:]
    wall = sum(r["system/step_time_s"] for r in records)
    tokens = sum(r["rollout/tokens"] for r in records)
    return {
        "steps": len(records),
        "wall_s": wall,
        "steps_per_s": len(records) / wall,
        "tokens_per_s": tokens / wall,
        "median_step_s": float(np.median([r["system/step_time_s"] for r in records])),
        "split_s_per_step": {k.split("/")[1]: float(np.mean([r[k] for r in records])) for k in STEP_SPLIT},
    }


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--out", default=str(OUT_DIR / "runtime.json"))
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    init_ray(make_cfg([]))
    steps = [f"trainer.steps={args.steps}"]
    out: dict = {}
    for engine in ("hf", "vllm"):
        out[f"engine={engine}"] = train_run([*steps, f"samplers.engine={engine}"])
        print(engine, json.dumps(out[f"engine={engine}"]), flush=True)
    for eta in (0, 1):
        out[f"eta={eta}"] = train_run([*steps, f"async.max_staleness={eta}"])
        print(f"eta={eta}", json.dumps(out[f"eta={eta}"]), flush=True)
    write_json(args.out, out)
    print(f"eta=0 / eta=1 wall-time ratio: {out['eta=0']['wall_s'] / out['eta=1']['wall_s']:.2f}")
    print(
        f"vllm / hf tokens/s ratio: {out['engine=vllm']['tokens_per_s'] / out['engine=hf']['tokens_per_s']:.2f}"
    )


if __name__ == "__main__":
    main()
