""" "Generate n, verify": the project's one loop from prompts to rewards (`sample_rewards`), or to the
completions with their rewards (`sample_completions`, for `python -m exgrpo.evaluate --save-completions`);
and `build_groups`, the one place that turns a sampler's completions and rewards into `Group`s (both
samplers, `actors/sampler.py` and `actors/continuous_sampler.py`).

Used by the samplers' held-out evaluation, `python -m exgrpo.evaluate` and the base-model measurements.
Engine-agnostic (anything implementing `GenerationEngine.generate`); imports no Ray, vLLM or DeepSpeed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from exgrpo.core.config import TemplateName
from exgrpo.core.records import GenerationRequest, Group, Prompt, Trajectory
from exgrpo.data.templates import render_prompt, reward_mode

if TYPE_CHECKING:  # the engines import torch; evaluate itself only calls `generate`
    from actors.engines import Completion, GenerationEngine


class Scorer(Protocol):
    """What `evaluate` needs from a reward (`Verifier` and `exgrpo.verify.rewards.FunctionReward` are ones)."""

    def score_prompts(self, prompts: Sequence[Prompt], completions: Sequence[str]) -> list[float]: ...


@dataclass(frozen=True)
class Samples:
    """One prompt's n sampled completions and their rewards, in sample order."""

    texts: tuple[str, ...]
    rewards: tuple[float, ...]


def sample_rewards(
    engine: GenerationEngine, verifier: Scorer, prompts: Sequence[Prompt], **options: Any
) -> list[tuple[float, ...]]:
    """Per prompt, the rewards of its n sampled responses: `sample_completions` (same options) without
    the texts."""
    return [s.rewards for s in sample_completions(engine, verifier, prompts, **options)]


def sample_completions(
    engine: GenerationEngine,
    verifier: Scorer,
    prompts: Sequence[Prompt],
    *,
    n: int,
    template: TemplateName,
    max_tokens: int,
    temperature: float,
    top_p: float = 1.0,
    seed: int | None = None,
    tokenizer: Any = None,
) -> list[Samples]:
    """Per prompt, its n sampled responses and their rewards: one engine call, one verifier call.

    Prompts are rendered with `render_prompt(question, template=..., tokenizer=...)`; `tokenizer`
    defaults to the engine's own `tokenizer` attribute when it has one. The engine call is
    `generate(texts, n=n, max_tokens=, temperature=, top_p=, seed=)` (vLLM seeds prompt i's sample
    j with seed + i * n + j). At temperature 0 all n samples would be the greedy decode: one is
    generated and it (with its reward) repeated n times. The verifier's extraction mode must be
    `reward_mode(template)` (checked when the verifier has a `mode`).
    """
    check_scoring(verifier, n=n, temperature=temperature, template=template)
    if not prompts:
        return []
    if tokenizer is None:
        tokenizer = getattr(engine, "tokenizer", None)
    texts = [render_prompt(p.question, template=template, tokenizer=tokenizer) for p in prompts]
    drawn = 1 if temperature == 0 else n
    outs = engine.generate(
        texts, n=drawn, max_tokens=max_tokens, temperature=temperature, top_p=top_p, seed=seed
    )
    if len(outs) != len(prompts) or any(len(comps) != drawn for comps in outs):
        raise RuntimeError(
            f"the engine returned {[len(c) for c in outs]} completions for {len(prompts)} prompts, "
            f"asked for {drawn} each"
        )
    asked = [p for p in prompts for _ in range(drawn)]
    rewards = verifier.score_prompts(asked, [c.text for comps in outs for c in comps])
    return [
        Samples(
            texts=tuple(c.text for c in comps) * (n // drawn),
            rewards=tuple(rewards[i * drawn : (i + 1) * drawn]) * (n // drawn),
        )
        for i, comps in enumerate(outs)
    ]


def check_scoring(verifier: Scorer, *, n: int, temperature: float, template: TemplateName) -> None:
    if n < 1:
        raise ValueError(f"n must be >= 1 samples per question, got {n}")
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0 (0 = greedy), got {temperature}")
    mode = reward_mode(template)
    if getattr(verifier, "mode", mode) not in (mode, None):  # None: a reward that reads no answer region
        raise ValueError(
            f"template {template!r} puts the final answer in {mode!r} mode but the verifier extracts "
            f"in {verifier.mode!r} mode; make it with Verifier(mode=reward_mode(template))"
        )


def build_groups(
    requests: Sequence[GenerationRequest],
    prompt_ids: Sequence[Sequence[int]],
    outs: Sequence[Sequence[Completion]],
    rewards: Sequence[float],
    *,
    versions: Sequence[int],
) -> list[Group]:
    """One `Group` per request, its trajectories in completion order; `rewards` flat over all completions.

    `versions[i]` is the policy version request i started under. A completion with `version_spans` (the
    weights changed while it was generated) keeps them as its `Trajectory.version_spans` (when there are
    several) and takes its `policy_version` from the first, the oldest; a group's is its trajectories'
    oldest."""
    groups, i = [], 0
    for r, (req, ids, comps) in enumerate(zip(requests, prompt_ids, outs, strict=True)):
        gid = f"r{req.request_id}"  # deterministic, so resumed runs store identical records
        trajs = []
        for c in comps:
            vs = c.version_spans
            trajs.append(
                Trajectory(
                    qid=req.prompt.qid,
                    response_ids=tuple(c.token_ids),
                    logprobs=tuple(c.logprobs),
                    reward=rewards[i],
                    policy_version=vs[0][1] if vs else versions[r],
                    text=c.text,
                    group_id=gid,
                    version_spans=vs if len(vs) > 1 else (),
                )
            )
            i += 1
        groups.append(
            Group(
                qid=req.prompt.qid,
                prompt_ids=tuple(ids),
                trajectories=tuple(trajs),
                kind=req.kind,
                gold=req.prompt.answer,
                group_id=gid,
                request_id=req.request_id,
                policy_version=min((t.policy_version for t in trajs), default=versions[r]),
                admitted_version=req.admitted_version,
                candidates=req.candidates,
            )
        )
    return groups
