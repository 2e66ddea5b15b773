"""Throughput of exgrpo.rewards.Verifier.score_many (answers per second).

Run: .venv/bin/python bench/bench_rewards.py [--workers 1 2]

Workloads: 1,000 boxed integers (half right, half off by one), scored with the integer fast path
and with it off (every answer through a math-verify worker); 100 expanded quadratics
`\\boxed{x^2+2ax+a^2}` against the gold `(x+a)^2` (all right, symbolic simplification).
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

from exgrpo.rewards import Verifier, boxed


@dataclass(frozen=True)
class Workload:
    name: str
    responses: list[str]
    golds: list[str]
    expected_correct: int


def workloads() -> list[Workload]:
    ints = [(f"The total is {boxed(k + k % 2)}.", str(k)) for k in range(1000)]  # odd k: off by one
    polys = [(f"Expanding, {boxed(f'x^2+{2 * a}x+{a * a}')}", f"(x+{a})^2") for a in range(1, 101)]
    return [
        Workload("1000 boxed integers", [r for r, _ in ints], [g for _, g in ints], 500),
        Workload("100 polynomials", [r for r, _ in polys], [g for _, g in polys], 100),
    ]


def bench(workers: int, *, fast_path: bool, workload: Workload) -> None:
    with Verifier(workers=workers, fast_path=fast_path, timeout_s=5.0) as verifier:
        verifier.start()
        start = time.perf_counter()
        rewards = verifier.score_many(workload.responses, workload.golds)
        seconds = time.perf_counter() - start
        stats = verifier.stats()
    correct = int(sum(rewards))
    assert correct == workload.expected_correct, (workload.name, correct)
    print(
        f"{workload.name:<20} workers={workers} fast_path={fast_path!s:<5} "
        f"{len(rewards) / seconds:>10.1f} answers/s  ({seconds:.3f} s, {correct} correct, "
        f"{stats.timeouts} timeouts)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    args = parser.parse_args()
    ints, polys = workloads()
    for workers in args.workers:
        bench(workers, fast_path=True, workload=ints)
        bench(workers, fast_path=False, workload=ints)
        bench(workers, fast_path=True, workload=polys)


if __name__ == "__main__":
    main()
