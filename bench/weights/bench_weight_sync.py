"""Weight sync of a ~100M-parameter fp32 model to 2 samplers, against the memory-bandwidth floor of the same run.

    .venv/bin/python -m bench.weights.bench_weight_sync [--repeats 7] [--warmup 5] [--samplers 2] [--skip-vllm]
        [--only "HF" "vLLM samplers" "child process" "gloo"]

The cases, the warm-up and the floor ((1 + S) memcpy): docs/benchmarks.md, "Weight sync against the memory
floor".
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from bench.common import OUT_DIR, env_defaults, stopwatch, write_json

env_defaults(ray=True)

import numpy as np  # noqa: E402
import ray  # noqa: E402

from bench.weights.model_100m import MODEL  # noqa: E402  (registers builtin:bench-100m)
from exgrpo.core.config_files import load_config  # noqa: E402
from exgrpo.models.resolve import resolve_model  # noqa: E402
from exgrpo.runtime.assembly import build_system  # noqa: E402
from exgrpo.runtime.env import init_ray  # noqa: E402

CASES = {  # name: (engine, transport, the vLLM engines' weight paths: None = their own choice, engine core)
    "object_store, HF samplers": ("hf", "object_store", None, "inline"),
    "object_store, vLLM samplers": ("vllm", "object_store", ("direct", "reload"), "inline"),
    # the GPU layout: vLLM's engine core in a process of its own, weights staged in a file (/dev/shm)
    "object_store, vLLM samplers, core in a child process": (
        "vllm",
        "object_store",
        ("direct", "reload"),
        "child",
    ),
    "vLLM weight-transfer API (gloo), vLLM samplers": ("vllm", "collective", None, "inline"),
}
PATH_NAMES = {"direct": "direct load", "reload": "vLLM's reload, before"}


def memcpy_s(nbytes: int, repeats: int = 5) -> float:
    src = np.random.default_rng(0).integers(0, 255, nbytes, dtype=np.uint8)
    dst = np.empty_like(src)
    times = []
    for _ in range(repeats):
        with stopwatch() as copy:
            np.copyto(dst, src)
        times.append(copy.s)
    return float(np.median(times))


def sync_case(
    engine: str,
    transport: str,
    weight_paths: tuple[str, ...] | None,
    process: str = "inline",
    *,
    samplers: int,
    repeats: int,
    warmup: int,
) -> dict[str | None, dict]:
    """Sync times of one system; with `weight_paths`, its broadcasts take the paths in turn (one system,
    interleaved, so the load of the machine falls on every path alike): {path: figures}."""
    cfg = load_config(
        "tiny-cpu",
        [
            "logging.progress=false",
            f"model.path={MODEL}",
            f"samplers.engine={engine}",
            f"async.weight_sync={transport}",
            f"samplers.num={samplers}",
            "samplers.num_cpus=0.5",
            f"samplers.engine_process={process}",
        ],
    )
    model_path = str(resolve_model(cfg.model.path, cache_dir=cfg.model.cache_dir))
    system = build_system(cfg, model_path=model_path)
    # the concrete SamplerPool and LearnerGroup: members() and num_parameters() are no role verbs
    pool: Any = system.samplers
    group: Any = system.learners
    handles = list(pool.members().values())
    ray.get([h.ping.remote() for h in handles])
    turns: tuple[str | None, ...] = weight_paths or (None,)
    runs: dict[str | None, dict[str, list]] = {
        p: {"total": [], "export": [], "apply": [], "first": []} for p in turns
    }
    try:
        for v in range(1, (repeats + warmup) * len(turns) + 1):
            path = turns[v % len(turns)]
            if path is not None:  # `VLLMEngine.weight_path`: the path before the direct load, in the same run
                ray.get([h.apply.remote(_set_weight_path, path) for h in handles])
            assert path is None or ray.get([h.apply.remote(_weight_path) for h in handles]) == [path] * len(
                handles
            )
            run = runs[path]
            t0 = time.perf_counter()
            metrics = system.weights.broadcast(version=v)
            t1 = time.perf_counter()
            assert ray.get([h.version.remote() for h in handles]) == [v] * len(handles)
            t2 = time.perf_counter()
            if len(run["first"]) < warmup:
                run["first"].append(round(t2 - t0, 4))
            else:
                run["total"].append(t2 - t0)
                run["export"].append(t1 - t0)
                run["apply"].append(float(np.mean(ray.get([h.apply.remote(_last_load) for h in handles]))))
            del metrics
        params = group.num_parameters()
        served = ray.get([h.apply.remote(_weight_path) for h in handles])
    finally:
        system.shutdown()
    return {
        path: {
            "params": params,
            "weight_path": [path] * len(handles) if path else served,
            "sync_s": float(np.median(r["total"])),
            "best_s": float(np.min(r["total"])),
            "driver_blocked_s": float(np.median(r["export"])),
            "sampler_apply_s": float(np.median(r["apply"])),
            "all_s": [round(t, 4) for t in r["total"]],
            "warmup_s": r["first"],
        }
        for path, r in runs.items()
    }


def _last_load(sampler) -> float:
    return sampler.weight_load_s


def _set_weight_path(sampler, path: str) -> None:
    sampler.engine.weight_path = path


def _weight_path(sampler) -> str:
    return getattr(sampler.engine, "weight_path", "hf")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--samplers", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--skip-vllm", action="store_true")
    parser.add_argument(
        "--only", nargs="*", default=[], help="run the cases whose name contains one of these"
    )
    parser.add_argument("--out", default=str(OUT_DIR / "weight_sync.json"))
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    init_ray(load_config("tiny-cpu", []))
    out: dict = {}
    copies = []
    for case, (engine, transport, weight_paths, process) in CASES.items():
        if (args.skip_vllm and engine == "vllm") or (args.only and not any(o in case for o in args.only)):
            continue
        results = sync_case(
            engine,
            transport,
            weight_paths,
            process,
            samplers=args.samplers,
            repeats=args.repeats,
            warmup=args.warmup,
        )
        for path, r in results.items():
            name = case if path is None else f"{case} ({PATH_NAMES[path]})"
            out[name] = r
            print(name, json.dumps(r), flush=True)
        # fp32, the tied embedding once: what the packed buffer holds
        nbytes = 4 * next(iter(results.values()))["params"]
        copies.append(memcpy_s(nbytes))  # the floor is measured beside every case (the machine is noisy)
    t_copy = float(np.min(copies))  # the floor: the best bandwidth seen
    floor = (1 + args.samplers) * t_copy
    out["floor"] = {
        "bytes": nbytes,
        "memcpy_s": t_copy,
        "floor_s": floor,
        "memcpy_GBps": nbytes / t_copy / 1e9,
    }
    print(
        f"\nfloor: (1 + {args.samplers}) x memcpy of {nbytes / 1e6:.0f} MB ({t_copy * 1e3:.1f} ms, "
        f"{nbytes / t_copy / 1e9:.1f} GB/s) = {floor * 1e3:.0f} ms"
    )
    print(
        f"{'case (medians; best of the repeats in brackets)':<56} {'sync (ms)':>10} {'/ floor':>8} {'best / floor':>13} "
        f"{'driver blocked':>15} {'sampler apply':>14}"
    )
    for name, r in out.items():
        if name != "floor":
            print(
                f"{name:<56} {r['sync_s'] * 1e3:>10.0f} {r['sync_s'] / floor:>8.2f} {r['best_s'] / floor:>13.2f} "
                f"{r['driver_blocked_s'] * 1e3:>12.0f} ms {r['sampler_apply_s'] * 1e3:>11.0f} ms"
            )
    write_json(args.out, out)


if __name__ == "__main__":
    main()
