"""Throughput and adversarial latency of exgrpo.verify.verifier (answers per second, seconds per case).

Run: .venv/bin/python -m bench.sampling.bench_rewards [--workers 1 2] [--quick] [--timeout-s 5]

It uses only `Verifier`'s public verbs and `boxed`, so it also measures an older checkout (run from there with
this one on PYTHONPATH). The workloads: docs/benchmarks.md, "Rewards".
"""

from __future__ import annotations

import argparse
import threading
import time
from dataclasses import dataclass

import exgrpo.verify.verifier
from exgrpo.verify.answers import boxed
from exgrpo.verify.verifier import Verifier

TIMEOUT_S = 5.0  # the verifier's deadline per answer (--timeout-s)
TOWER = r"\boxed{9^{9^{9^{9^{9}}}}}"  # sympy tries to compute it
TOWER_GOLD = "9^{9^{9^{9^{8}}}}"  # against a tower gold it never returns: only the deadline ends it


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


def bench(workers: int, *, fast_path: bool, workload: Workload, timeout_s: float = TIMEOUT_S) -> None:
    with Verifier(workers=workers, fast_path=fast_path, timeout_s=timeout_s) as verifier:
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


def throughput(workers: int, threads: int, n: int = 120, *, timeout_s: float = TIMEOUT_S) -> float:
    """answers/s of score() calls (one answer each) from `threads` threads at once."""
    polys = [(boxed(f"x^2+{2 * a}x+{a * a}"), f"(x+{a})^2") for a in range(1, n + 1)]
    with Verifier(workers=workers, timeout_s=timeout_s) as verifier:
        verifier.start()
        parts = [polys[i::threads] for i in range(threads)]
        start = time.perf_counter()
        pool = [threading.Thread(target=lambda p=p: [verifier.score(r, g) for r, g in p]) for p in parts]
        for t in pool:
            t.start()
        for t in pool:
            t.join()
        return n / (time.perf_counter() - start)


def concurrent_easy(verifier: Verifier, gold: str) -> tuple[float, float]:
    """3 threads at once: two pathological score() calls, then an easy one; (easy reward, latency)."""
    results: dict[str, tuple[float, float]] = {}

    def run(key: str, response: str, gold: str) -> None:
        start = time.perf_counter()
        results[key] = (verifier.score(response, gold), time.perf_counter() - start)

    threads = [threading.Thread(target=run, args=(f"tower{i}", TOWER, gold)) for i in range(2)]
    threads.append(threading.Thread(target=run, args=("easy", r"\boxed{\frac{1}{2}}", "0.5")))
    for t in threads:
        t.start()
        time.sleep(0.05)  # the pathological ones first
    for t in threads:
        t.join()
    return results["easy"]


def mixed_batch(verifier: Verifier, gold: str) -> tuple[float, float]:
    """score_many of 10 pathological + 10 normal answers: (seconds, rewards summed)."""
    start = time.perf_counter()
    rewards = verifier.score_many(
        [TOWER] * 10 + [boxed(k) for k in range(10)], [gold] * 10 + [str(k) for k in range(10)]
    )
    return time.perf_counter() - start, sum(rewards)


ADVERSARIAL = [
    (r"\boxed{43 = 42}", "42"),
    (r"\boxed{0 = 42}", "42"),
    (r"\boxed{1+1 = 42}", "42"),
    (r"\boxed{x \approx 42}", "42"),
    (r"\boxed{x = 42}", "42"),
    (r"\boxed{" + "(" * 450 + "42" + ")" * 450 + "}", "42"),
    (r"\boxed{1} and \boxed{2} and \boxed{3}", r"\{1,2,3\}"),
    (r"\boxed{1,2}", r"\boxed{1}\boxed{2}"),
    (r"\boxed{1 000}", "1000"),
    (r"\boxed{1,000}", "1000"),
    (r"\boxed{1000,99}", "1000.99"),
    ("The final answer is 42.", "42"),
    (TOWER, "1"),
    (TOWER, TOWER_GOLD),
]


def adversarial(workers: int = 2, *, timeout_s: float = TIMEOUT_S) -> None:
    print("| case | seconds | reward |\n|---|---|---|")
    with Verifier(workers=workers, timeout_s=timeout_s, max_answer_chars=None) as verifier:
        verifier.start()
        for response, gold in ADVERSARIAL:
            start = time.perf_counter()
            reward = verifier.score(response, gold)
            name = response if len(response) < 50 else response[:20] + f"...({len(response)} chars)"
            print(f"| `{name}` vs `{gold}` | {time.perf_counter() - start:.2f} | {reward} |")
        for label, gold in (("tower vs tower gold", TOWER_GOLD), ("tower vs 1", "1")):
            reward, seconds = concurrent_easy(verifier, gold)
            print(
                f"| 3 threads: 2 x {label}, then an easy answer (easy's latency) | {seconds:.2f} | {reward} |"
            )
            seconds, total = mixed_batch(verifier, gold)
            print(f"| score_many 10 x {label} + 10 normal (total) | {seconds:.2f} | {total} of 20 |")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--quick", action="store_true", help="skip the fast_path=False integer runs")
    parser.add_argument(
        "--timeout-s", type=float, default=TIMEOUT_S, help="the verifier's deadline per answer (seconds)"
    )
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    deadline = args.timeout_s
    print(f"exgrpo.verify.verifier: {exgrpo.verify.verifier.__file__}")
    ints, polys = workloads()
    for workers in args.workers:
        bench(workers, fast_path=True, workload=ints, timeout_s=deadline)
        if not args.quick:
            bench(workers, fast_path=False, workload=ints, timeout_s=deadline)
        bench(workers, fast_path=True, workload=polys, timeout_s=deadline)
    for threads in (1, 3):
        rate = throughput(2, threads, timeout_s=deadline)
        print(
            f"polynomials, score() per answer, workers=2, {threads} thread(s) at once: {rate:.1f} answers/s"
        )
    adversarial(timeout_s=deadline)


if __name__ == "__main__":
    main()
