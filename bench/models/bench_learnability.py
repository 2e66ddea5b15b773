"""Is the warmed base model's RL signal learnable? A minimal on-policy Dr.GRPO loop, in-process, per learning
rate: held-out accuracy before, during and after (what configs/default.yaml's learners.lr, B, K and steps are
chosen from).

    .venv/bin/python -m bench.models.bench_learnability --model builtin:arith-base --lrs 3e-5,1e-4,2e-4

The loop and its loss: docs/benchmarks.md, "Base models and tasks".
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import torch
from transformers import AutoModelForCausalLM

from actors.engines import HFEngine
from actors.sampling import sample_rewards
from exgrpo.core.records import Prompt
from exgrpo.data.sources import read_source
from exgrpo.data.templates import render_prompt
from exgrpo.models.resolve import resolve_model
from exgrpo.verify.answers import extract_answer
from exgrpo.verify.verifier import Verifier

torch.set_num_threads(1)


def held_out_accuracy(
    engine: HFEngine, verifier: Verifier, prompts: list[Prompt], *, n: int, max_tokens: int
) -> float:
    rewards = sample_rewards(
        engine, verifier, prompts, n=n, template="plain", max_tokens=max_tokens, temperature=1.0, seed=12345
    )
    return float(np.mean(rewards))


def policy_gradient_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    prompt_ids: list[tuple[int, ...]],
    responses: list[tuple[int, ...]],
    advantages: list[float],
    *,
    max_tokens: int,
) -> None:
    """One AdamW step on L = mean_i [ -A_i * sum_t log pi(y_it) / max_tokens ]."""
    width = max(len(p) + len(r) for p, r in zip(prompt_ids, responses, strict=True))
    ids = torch.zeros((len(responses), width), dtype=torch.long)  # (R, T), right-padded
    mask = torch.zeros((len(responses), width))  # (R, T): 1 on response tokens
    for i, (p, r) in enumerate(zip(prompt_ids, responses, strict=True)):
        ids[i, : len(p) + len(r)] = torch.tensor([*p, *r])
        mask[i, len(p) : len(p) + len(r)] = 1.0
    logits = model(input_ids=ids).logits[:, :-1]  # (R, T-1, V): position t predicts token t+1
    logp = torch.log_softmax(logits.float(), dim=-1).gather(2, ids[:, 1:, None]).squeeze(2)  # (R, T-1)
    seq_logp = (logp * mask[:, 1:]).sum(dim=1) / max_tokens  # (R,)
    loss = -(torch.tensor(advantages) * seq_logp).mean()
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()


def run_lr(
    model_dir: Path, lr: float, args: argparse.Namespace, train: list[Prompt], evaluation: list[Prompt]
) -> None:
    torch.manual_seed(0)
    engine = HFEngine(model_dir, seed=0)
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.999), weight_decay=0.01)
    order = np.random.default_rng(0).permutation(len(train))
    accuracy: dict[int, float] = {}
    rewards_per_step, no_answer, mixed, seconds = [], [], [], []
    with Verifier() as verifier:
        accuracy[0] = held_out_accuracy(
            engine, verifier, evaluation, n=args.eval_n, max_tokens=args.max_tokens
        )
        for step in range(1, args.steps + 1):
            start = time.perf_counter()
            batch = [train[i % len(train)] for i in order[(step - 1) * args.B : step * args.B]]
            texts = [render_prompt(p.question, template="plain") for p in batch]
            groups = engine.generate(texts, n=args.K, max_tokens=args.max_tokens, temperature=1.0, seed=step)
            responses = [c for g in groups for c in g]
            r = np.asarray(
                verifier.score_many(
                    [c.text for c in responses], [p.answer for p in batch for _ in range(args.K)]
                )
            ).reshape(args.B, args.K)  # (B, K)
            advantages = (r - r.mean(axis=1, keepdims=True)).reshape(-1)  # Dr.GRPO: r - mean, no std
            model.train()
            policy_gradient_step(
                model,
                optimizer,
                [engine.tokenize(t) for t in texts for _ in range(args.K)],
                [c.token_ids for c in responses],
                advantages.tolist(),
                max_tokens=args.max_tokens,
            )
            model.eval()
            engine.load_weights(model.state_dict(), version=step)
            k = r.sum(axis=1)
            rewards_per_step.append(float(r.mean()))
            no_answer.append(float(np.mean([extract_answer(c.text) is None for c in responses])))
            mixed.append(int(((k > 0) & (k < args.K)).sum()))
            seconds.append(time.perf_counter() - start)
            if step % args.eval_every == 0 or step == args.steps:
                accuracy[step] = held_out_accuracy(
                    engine, verifier, evaluation, n=args.eval_n, max_tokens=args.max_tokens
                )
    third = max(1, args.steps // 3)
    curve = "  ".join(f"@{s}: {a:.3f}" for s, a in accuracy.items())
    print(
        f"lr={lr:g} B={args.B} K={args.K} steps={args.steps}: held-out {curve} "
        f"(gain {accuracy[args.steps] - accuracy[0]:+.3f}) | train reward first/last third "
        f"{np.mean(rewards_per_step[:third]):.3f}/{np.mean(rewards_per_step[-third:]):.3f} | no answer "
        f"{np.mean(no_answer[:third]):.3f}/{np.mean(no_answer[-third:]):.3f} | mixed groups/step "
        f"{np.mean(mixed):.1f}/{args.B} | {np.mean(seconds):.2f} s/step",
        flush=True,
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="builtin:arith-base", help="builtin:<name> or an HF model dir")
    parser.add_argument("--cache-dir", default="~/.cache/exgrpo")
    parser.add_argument("--data", default="builtin:arith", help="builtin:<task> (its train and eval splits)")
    parser.add_argument("--lrs", default="3e-5,1e-4,2e-4", help="comma-separated AdamW learning rates")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--B", type=int, default=16, help="questions per step")
    parser.add_argument("--K", type=int, default=8, help="rollouts per question")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--num-train", type=int, default=2000)
    parser.add_argument("--num-eval", type=int, default=200)
    parser.add_argument("--eval-n", type=int, default=4, help="samples per eval question")
    parser.add_argument("--eval-every", type=int, default=10)
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    model_dir = resolve_model(args.model, cache_dir=args.cache_dir)
    train = list(read_source(args.data, split="train", num=args.num_train, seed=0).prompts)
    evaluation = list(read_source(args.data, split="eval", num=args.num_eval, seed=0).prompts)
    print(f"model {args.model} -> {model_dir}", flush=True)
    for lr in (float(x) for x in args.lrs.split(",")):
        run_lr(model_dir, lr, args, train, evaluation)


if __name__ == "__main__":
    main()
