"""Runtime figures for issue 3, measured side by side in one local Ray cluster.

    .venv/bin/python bench/bench_runtime.py [--steps 8] [--skip-100m]

1. steps/s and generated tokens/s of the tiny config with each engine (hf, vllm);
2. per-step time split (generation wait, entropy scoring, update, sync, idle);
3. wall time for the same number of steps with eta = 0 vs eta = 1;
4. weight-sync time per transport (object_store, collective) for the tiny model and a ~100M model.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np
import ray

os.environ.setdefault("RAY_AUTH_MODE", "disabled")

from exgrpo.config import load_config  # noqa: E402
from exgrpo.launch import build_system, init_ray, train  # noqa: E402
from exgrpo.models.resolve import BuiltinModel, register_builtin, resolve_model  # noqa: E402
from exgrpo.models.tiny import TinyModelSpec, build_tiny_model  # noqa: E402

SPLIT = ["system/wait_s", "system/entropy_s", "system/update_s", "system/sync_s", "system/idle_s"]
SPEC_100M = TinyModelSpec(hidden_size=768, num_layers=14, num_heads=12, num_kv_heads=4, head_dim=64,
                          intermediate_size=2304, max_position=256)
register_builtin("bench-100m", BuiltinModel(build=lambda out_dir, *, cache_dir: build_tiny_model(out_dir, spec=SPEC_100M),
                                            fingerprint=SPEC_100M.fingerprint()))


def make_cfg(overrides: list[str]):
    return load_config("tiny-cpu", ["logging.progress=false", "logging.plots=false", "trainer.eval_every=0",
                                    "data.num_eval=0", "logging.run_dir=bench/out/run", *overrides])


def train_run(overrides: list[str]) -> dict:
    """2N steps through `launch.train`; the first N warm up (engine first calls, DeepSpeed first step)."""
    cfg = make_cfg(overrides)
    n = cfg.trainer.steps
    records = train(make_cfg([*overrides, f"trainer.steps={2 * n}"]), checkpoints=False).records[n:]
    wall = sum(r["system/step_time_s"] for r in records)
    tokens = sum(r["rollout/tokens"] for r in records)
    return {"steps": len(records), "wall_s": wall, "steps_per_s": len(records) / wall, "tokens_per_s": tokens / wall,
            "median_step_s": float(np.median([r["system/step_time_s"] for r in records])),
            "split_s_per_step": {k.split("/")[1]: float(np.mean([r[k] for r in records])) for k in SPLIT}}


def sync_run(model: str, transport: str, repeats: int = 3) -> dict:
    cfg = make_cfg([f"model.path={model}", f"async.weight_sync={transport}", "samplers.num=2"])
    model_path = str(resolve_model(cfg.model.path, cache_dir=cfg.model.cache_dir))
    system = build_system(cfg, model_path=model_path)
    times, loads = [], []
    try:
        for v in range(repeats + 1):
            t0 = time.perf_counter()
            metrics = system.weights.broadcast(version=v + 1)
            # wait until every sampler has applied the weights (object store loads are asynchronous)
            ray.get([h.version.remote() for h in system.samplers.members().values()])
            if v:  # first one warms up the group / the store
                times.append(time.perf_counter() - t0)
                loads.append(metrics.get("system/weight_load_s", 0.0))
        params = system.learners.num_parameters()
    finally:
        system.shutdown()
    return {"params": int(params), "sync_s": float(np.median(times)), "sampler_load_s": float(np.median(loads))}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--skip-100m", action="store_true")
    parser.add_argument("--out", default="bench/out/runtime.json")
    args = parser.parse_args()
    init_ray(make_cfg([]))
    steps = [f"trainer.steps={args.steps}"]
    out: dict = {}
    for engine in ("hf", "vllm"):
        out[f"engine={engine}"] = train_run([*steps, f"samplers.engine={engine}"])
        print(engine, json.dumps(out[f"engine={engine}"]), flush=True)
    for eta in (0, 1):
        out[f"eta={eta}"] = train_run([*steps, f"async.max_staleness={eta}"])
        print(f"eta={eta}", json.dumps(out[f"eta={eta}"]), flush=True)
    models = ["builtin:tiny"] + ([] if args.skip_100m else ["builtin:bench-100m"])
    for model in models:
        for transport in ("object_store", "collective"):
            key = f"sync {model} {transport}"
            out[key] = sync_run(model, transport)
            print(key, json.dumps(out[key]), flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2))
    print(f"eta=0 / eta=1 wall-time ratio: {out['eta=0']['wall_s'] / out['eta=1']['wall_s']:.2f}")
    print(f"vllm / hf tokens/s ratio: {out['engine=vllm']['tokens_per_s'] / out['engine=hf']['tokens_per_s']:.2f}")


if __name__ == "__main__":
    main()
