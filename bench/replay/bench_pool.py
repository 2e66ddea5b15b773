"""Experience-pool micro-benchmark: sampling time and memory per stored trajectory.

    .venv/bin/python -m bench.replay.bench_pool [--questions 50000] [--repeats 2000] [--memory-questions 200]
        [--length 1000]

What it draws and how it counts bytes: docs/benchmarks.md, "Experience pool".
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import tracemalloc

import numpy as np
import pyarrow.parquet as pq

from bench.common import stopwatch
from buffers.experience import ExperiencePool
from exgrpo.core.records import Group, Trajectory
from exgrpo.core.selection import draw_plan

K = 8


def make_group(qid: str, k: int, length: int, rng: np.random.Generator, version: int = 0) -> Group:
    """K rollouts of `length` random tokens (vocabulary 50k), the first k correct."""
    trajectories = tuple(
        Trajectory(
            qid,
            tuple(rng.integers(0, 50_000, size=length).tolist()),
            tuple((-rng.exponential(size=length)).tolist()),
            float(i < k),
            version,
        )
        for i in range(K)
    )
    return Group(qid, tuple(range(100)), trajectories, policy_version=version)


def bench_sampling(n_questions: int = 50_000, repeats: int = 2000) -> None:
    rng = np.random.default_rng(0)
    pool = ExperiencePool(K)
    with stopwatch() as build:
        for i in range(n_questions):
            pool.record(make_group(f"q{i}", int(rng.integers(1, K)), 4, rng), collect=True)
    print(f"pool: {len(pool)} sampleable questions, buckets {pool.bucket_sizes()}, built in {build.s:.1f} s")
    times = []
    for _ in range(repeats):
        with stopwatch() as draw:
            plan = draw_plan([pool.bucket_sizes()], 64, k_rollouts=K, rng=rng)[
                0
            ]  # what one shard is asked for
            got = pool.sample_from_buckets(plan, rng=rng)
        times.append(draw.s)
    assert len(set(got)) == 64
    us = np.array(times) * 1e6
    print(
        f"draw 64 questions: median {np.median(us):.0f} us, mean {us.mean():.0f} us, "
        f"p99 {np.percentile(us, 99):.0f} us over {repeats} calls"
    )


def bench_memory(n_questions: int = 200, length: int = 1000) -> None:
    rng = np.random.default_rng(1)
    groups = [make_group(f"q{i}", K - 1, length, rng) for i in range(n_questions)]
    pool = ExperiencePool(K)
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for g in groups:
        pool.record(g, collect=True)
    in_memory = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    n = pool.num_trajectories()
    print(f"memory: {n} stored trajectories of {length} tokens")
    print(f"  in memory as stored: {in_memory / n:,.0f} bytes per trajectory (question overhead included)")
    table = pool.to_arrow()
    print(f"  Arrow table in memory: {table.nbytes / n:,.0f} bytes per trajectory")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "pool.parquet")
        with stopwatch() as write:
            pq.write_table(table, path)
        size = os.path.getsize(path)
        with stopwatch() as read:
            back = ExperiencePool.from_arrow(pq.read_table(path), k_rollouts=K)
    assert back == pool
    print(f"  parquet snapshot: {size / n:,.0f} bytes per trajectory (file {size / 1e6:.1f} MB)")
    print(f"  snapshot write {write.s * 1e3:.0f} ms, read + restore {read.s * 1e3:.0f} ms")
    as_tuples = sum(
        sys.getsizeof(x) for t in groups[0].trajectories[:1] for x in (t.response_ids, t.logprobs)
    )
    as_tuples += sum(sys.getsizeof(v) for v in groups[0].trajectories[0].response_ids)
    as_tuples += sum(sys.getsizeof(v) for v in groups[0].trajectories[0].logprobs)
    print(f"  for comparison, the same trajectory as Python tuples: ~{as_tuples:,} bytes")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--questions", type=int, default=50_000, help="sampleable questions in the draw's pool"
    )
    parser.add_argument("--repeats", type=int, default=2000, help="draws timed")
    parser.add_argument("--memory-questions", type=int, default=200, help="questions of the memory pool")
    parser.add_argument("--length", type=int, default=1000, help="tokens per trajectory of the memory pool")
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    bench_sampling(args.questions, args.repeats)
    bench_memory(args.memory_questions, args.length)


if __name__ == "__main__":
    main()
