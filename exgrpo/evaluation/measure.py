"""What a base model can do, measured the way the RL samplers see it: `HFEngine` sampling, the project's Verifier.

- `solve_counts` / `evaluate_solve_rate`: per prompt, how many of n sampled responses verify (the warm-up
  tests and `bench/models/bench_learnability.py`);
- `measure_traces`: the same on the scratchpad task, with the validity of each response's trace
  (`bench/models/bench_scratchpad_base.py`).

The builders in `exgrpo/models/` train and save; they never measure (that would make them import the engines).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from actors.engines import HFEngine
from actors.sampling import sample_rewards
from exgrpo.core.config import TemplateName
from exgrpo.core.records import Prompt
from exgrpo.data.scratchpad_trace import TraceCheck, check_trace
from exgrpo.data.templates import render_prompt, reward_mode
from exgrpo.verify.verifier import Verifier


def solve_counts(
    model_dir: Path | str,
    prompts: Sequence[Prompt],
    *,
    n: int = 1,
    temperature: float = 1.0,
    max_tokens: int = 16,
    template: TemplateName = "plain",
    seed: int = 0,
) -> list[int]:
    """Per prompt, how many of its n sampled responses (HFEngine, as the RL samplers generate)
    the project's Verifier scores correct (`actors.sampling.sample_rewards`)."""

    engine = HFEngine(model_dir, seed=seed)
    with Verifier(mode=reward_mode(template)) as verifier:
        rewards = sample_rewards(
            engine,
            verifier,
            prompts,
            n=n,
            template=template,
            max_tokens=max_tokens,
            temperature=temperature,
            seed=seed,
        )
    return [int(sum(r)) for r in rewards]


def evaluate_solve_rate(
    model_dir: Path | str,
    prompts: Sequence[Prompt],
    *,
    n: int = 1,
    temperature: float = 1.0,
    max_tokens: int = 16,
    template: TemplateName = "plain",
    seed: int = 0,
) -> float:
    """Fraction of the len(prompts) * n sampled responses that verify (see `solve_counts`)."""
    if not prompts or n < 1:
        raise ValueError(f"need at least one prompt and n >= 1, got {len(prompts)} prompts and n={n}")
    counts = solve_counts(
        model_dir, prompts, n=n, temperature=temperature, max_tokens=max_tokens, template=template, seed=seed
    )
    return sum(counts) / (len(prompts) * n)


@dataclass(frozen=True)
class SampledTraces:
    """Per prompt, its n sampled responses, their rewards (Verifier) and trace checks."""

    texts: tuple[tuple[str, ...], ...]
    rewards: tuple[tuple[float, ...], ...]
    checks: tuple[tuple[TraceCheck, ...], ...]

    def counts(self) -> list[int]:
        """k per prompt: how many of its samples the Verifier scored correct."""
        return [int(sum(r)) for r in self.rewards]


def measure_traces(
    model_dir: Path | str,
    prompts: Sequence[Prompt],
    *,
    n: int = 8,
    temperature: float = 1.0,
    max_tokens: int = 64,
    template: TemplateName = "plain",
    seed: int = 0,
) -> SampledTraces:
    """Sample n responses per prompt with `HFEngine` (as the RL samplers generate), score them with
    the project's `Verifier` and check each trace with `check_trace`."""

    engine = HFEngine(model_dir, seed=seed)
    texts = [render_prompt(p.question, template=template, tokenizer=engine.tokenizer) for p in prompts]
    outs = engine.generate(texts, n=n, max_tokens=max_tokens, temperature=temperature, seed=seed)
    responses = [tuple(c.text for c in comps) for comps in outs]
    with Verifier(mode=reward_mode(template)) as verifier:
        flat = verifier.score_many(
            [t for r in responses for t in r], [p.answer for p in prompts for _ in range(n)]
        )
    rewards = tuple(tuple(flat[i * n : (i + 1) * n]) for i in range(len(prompts)))
    checks = tuple(
        tuple(check_trace(p.question, t) for t in r) for p, r in zip(prompts, responses, strict=True)
    )
    return SampledTraces(texts=tuple(responses), rewards=rewards, checks=checks)
