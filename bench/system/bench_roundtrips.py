"""Blocking Ray round trips per step in the driver process, and the median step time.

    .venv/bin/python -m bench.system.bench_roundtrips [--config default] [--steps 20 40] [overrides ...]

Counts the driver's `ray.get` calls (and the blocking ones) for two step counts; the difference per step is the
figure. How, and how to measure another checkout: docs/benchmarks.md, "Driver round trips".
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

from bench.common import env_defaults, print_json


def count_run(config: str, steps: int, overrides: list[str]) -> dict:
    import ray

    calls = {"get": 0, "blocking": 0}
    original = ray.get

    def counting_get(refs, *args, **kwargs):
        calls["get"] += 1
        flat = refs if isinstance(refs, list) else [refs]
        if flat and not isinstance(flat[0], ray.ObjectRef):
            return original(refs, *args, **kwargs)
        ready, _ = ray.wait(flat, num_returns=len(flat), timeout=0, fetch_local=False)
        if len(ready) < len(flat):  # the driver waits for remote work: a blocking round trip
            calls["blocking"] += 1
        return original(refs, *args, **kwargs)

    ray.get = counting_get
    from exgrpo.run import main

    run_dir = Path(tempfile.mkdtemp(prefix="roundtrips-"))
    try:
        main(
            [
                "--config",
                config,
                f"trainer.steps={steps}",
                "trainer.eval_every=0",
                "logging.progress=false",
                "logging.plots=false",
                f"logging.run_dir={run_dir}",
                *overrides,
            ]
        )
    finally:
        ray.get = original
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    times = [r["system/step_time_s"] for r in records if r["step"] >= 0]  # step -1: the first evaluation
    return {
        "steps": steps,
        "ray_get_calls": calls["get"],
        "blocking_gets": calls["blocking"],
        "median_step_s": statistics.median(times[1:] or times),
    }


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", default="default")
    parser.add_argument("--steps", type=int, nargs=2, default=(20, 40))
    parser.add_argument("overrides", nargs="*")
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    env_defaults(ray=True)
    a = count_run(args.config, args.steps[0], args.overrides)
    print_json(a)
    b = count_run(args.config, args.steps[1], args.overrides)
    print_json(b)
    steps = b["steps"] - a["steps"]
    print_json(
        {
            "driver_ray_get_per_step": (b["ray_get_calls"] - a["ray_get_calls"]) / steps,
            "driver_blocking_gets_per_step": (b["blocking_gets"] - a["blocking_gets"]) / steps,
            "median_step_s": [a["median_step_s"], b["median_step_s"]],
        }
    )


if __name__ == "__main__":
    main()
