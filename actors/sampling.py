""" "Generate n, verify": the project's one loop from prompts to rewards (`sample_rewards`), or to the
completions with their rewards (`sample_completions`, for `python -m exgrpo.evaluate --save-completions`);
`generate_scored`, the sampler's call with verification overlapped with generation; and `build_groups`, the
one place that turns a sampler's completions and rewards into `Group`s (both samplers, `actors/sampler.py`
and `actors/continuous_sampler.py`).

Used by the samplers' held-out evaluation, `python -m exgrpo.evaluate` and the base-model measurements.
Engine-agnostic (anything implementing `GenerationEngine.generate`); imports no Ray, vLLM or DeepSpeed at
import time (`verifier_workers` asks Ray for the calling actor's CPUs when it is called).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
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
    extracts = getattr(verifier, "mode", mode)  # a reward without one reads what the template asks
    if extracts not in (mode, None):  # None: a reward that reads no answer region
        raise ValueError(
            f"template {template!r} puts the final answer in {mode!r} mode but the verifier extracts "
            f"in {extracts!r} mode; make it with Verifier(mode=reward_mode(template))"
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


# -- verification overlapped with generation (the synchronous sampler's call) -------------------------------


@dataclass(frozen=True)
class Scored:
    """A call's completions (per prompt, in order), their rewards (flat, in completion order), and the
    seconds generation took and verification added after it (only what did not overlap generation)."""

    outs: list[list[Completion]]
    rewards: list[float]
    gen_time_s: float
    verify_time_s: float


def generate_scored(
    engine: GenerationEngine,
    scorer: Scorer,
    prompts: Sequence[Prompt],
    texts: Sequence[str],
    *,
    overlap: bool = True,
    threads: int = 2,
    after_generate: Callable[[], None] | None = None,
    **options: Any,
) -> Scored:
    """`engine.generate(texts, **options)`, then the rewards of every completion against its prompt.

    With `overlap`, a request's completions are scored on `threads` threads (the scorer's worker pool takes
    calls from any thread) while the others still generate: a vLLM engine reports each request the moment
    it finishes (`StreamingLLM`); another engine's completions are all scored after its call. The rewards are
    those of one `score_prompts` call over the whole flat list: each completion is scored on its own, and
    a request whose streamed texts differ from the returned ones is scored again. `after_generate` runs
    between generation and the final wait (the sampler's fault point).

    What overlap buys depends on when requests finish (a request ends with its longest completion, so with K
    samples most end near the call's end) and on spare CPUs: on a GPU the workers' CPUs idle while it
    generates; on vLLM-CPU with one CPU, scoring meanwhile slowed generation ~2x (docs/benchmarks.md, "Sampler:
    seeds and overlapped verification"), so the sampler overlaps only with 2+ verifier workers by default."""
    streamed: dict[int, tuple[list[str], Future[list[float]]]] = {}
    pool = ThreadPoolExecutor(max(1, threads), thread_name_prefix="exgrpo-score") if overlap else None

    def submit(i: int, done: list[str]) -> None:
        assert pool is not None
        streamed[i] = (done, pool.submit(scorer.score_prompts, [prompts[i]] * len(done), done))

    try:
        t0 = time.perf_counter()
        outs = generate_streaming(engine, texts, on_done=submit if overlap else None, **options)
        t1 = time.perf_counter()
        if after_generate is not None:
            after_generate()
        if pool is None:
            flat = [c.text for comps in outs for c in comps]
            rewards = scorer.score_prompts(
                [p for p, comps in zip(prompts, outs, strict=True) for _ in comps], flat
            )
        else:
            for i, comps in enumerate(outs):
                if i not in streamed or streamed[i][0] != [c.text for c in comps]:
                    submit(i, [c.text for c in comps])  # not streamed (another engine), or not the same texts
            rewards = [r for i in range(len(outs)) for r in streamed[i][1].result()]
        return Scored(outs, rewards, gen_time_s=t1 - t0, verify_time_s=time.perf_counter() - t1)
    finally:
        if pool is not None:  # on an error, the scoring in flight ends at its deadline; nobody waits for it
            pool.shutdown(wait=False, cancel_futures=True)


def generate_streaming(
    engine: GenerationEngine,
    texts: Sequence[str],
    *,
    on_done: Callable[[int, list[str]], None] | None,
    **options: Any,
) -> list[list[Completion]]:
    """`engine.generate(texts, **options)`; a vLLM engine (one with an offline `llm`) also calls
    `on_done(i, completion texts)` from its step loop as prompt i's request finishes (`StreamingLLM`).
    The engine's own `generate` builds the requests and reads the outputs: only the loop is ours."""
    llm = getattr(engine, "llm", None)
    if on_done is None or llm is None or not hasattr(llm, "enqueue"):
        return engine.generate(texts, **options)
    n = options.get("n", 1)
    counts = [n] * len(texts) if isinstance(n, int) else list(n)
    asked = [i for i, k in enumerate(counts) if k > 0]  # the engine adds a request for these only
    stream = StreamingLLM(llm, lambda k, out: on_done(asked[k], [c.text for c in out.outputs]))
    setattr(engine, "llm", stream)  # noqa: B010 (the engine's attribute, for this call only)
    try:
        return engine.generate(texts, **options)
    finally:
        setattr(engine, "llm", llm)  # noqa: B010


class StreamingLLM:
    """vLLM's offline `LLM` whose `generate` reports each request the moment it finishes.

    `generate` is `LLM.generate`'s own two halves: `enqueue` (`LLM.generate` adds its requests the same
    way) and the loop of `LLM._run_engine` (step while requests are unfinished, keep the finished outputs,
    return them sorted by request id), which also calls `on_done(k, output)` for the k-th request of the
    call. So the batch, the scheduling and the outputs are `LLM.generate`'s; only the reporting is earlier.
    Anything else is the wrapped `LLM`'s."""

    def __init__(self, llm: Any, on_done: Callable[[int, Any], None]) -> None:
        self._llm, self._on_done = llm, on_done

    def __getattr__(self, name: str) -> Any:
        return getattr(self._llm, name)

    def generate(self, prompts: Any, sampling_params: Any = None, *, use_tqdm: Any = False, **kw: Any) -> Any:
        if kw or sampling_params is None:  # not the engine's plain call: vLLM's own loop
            return self._llm.generate(prompts, sampling_params, use_tqdm=use_tqdm, **kw)
        ids = self._llm.enqueue(prompts, sampling_params, use_tqdm=False)
        # outputs carry the id the request was added with; `enqueue` returns it with vLLM's random suffix
        position = {name: k for k, rid in enumerate(ids) for name in (rid, rid.rsplit("-", 1)[0])}
        core, outputs = self._llm.llm_engine, []
        while core.has_unfinished_requests():
            for output in core.step():
                if output.finished:
                    outputs.append(output)
                    if (k := position.get(output.request_id)) is not None:
                        self._on_done(k, output)
        return sorted(outputs, key=lambda x: int(x.request_id))


def verifier_workers(requested: int | float | None = None) -> int:
    """Verifier worker processes for a sampler: `requested` (`samplers.num_cpus`), else the CPUs Ray reserved
    for the calling actor (`samplers.num_cpus` again, when the actor was started with it), else 1; at least 1."""
    if requested is None:
        try:
            import ray

            if ray.is_initialized():
                requested = ray.get_runtime_context().get_assigned_resources().get("CPU")
        except Exception:  # not a Ray worker (the driver, a test): one worker
            requested = None
    return max(1, int(requested or 1))
