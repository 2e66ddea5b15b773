"""ContinuousSampler: the Sampler role over continuous batching, with in-flight weight updates (`samplers.continuous`).

An asyncio Ray actor around `actors.continuous_engine.ContinuousEngine` (vLLM, object-store weights) that serves
many `generate` calls at once: each request is verified, pushed (`actors.coalesce.CoalescedPush`) and reported when
its own completions are done. Invariants: a request admitted at version v starts only once this sampler serves v
or later, so staleness <= eta holds for every trajectory's oldest token; seeds are per request
(`actors.sampler_common`), but which tokens a version sampled depends on when its weights arrived. More:
docs/architecture.md ("Continuous sampler"); tests: tests/integration/test_continuous_sampler.py.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from actors.coalesce import CoalescedPush
from actors.continuous_engine import ContinuousEngine
from actors.engines import Completion
from actors.factory import make_engine
from actors.sampler_common import (
    EngineSpec,
    SamplerSettings,
    check_positions,
    engine_kwargs,
    new_failure_notes,
    request_seed,
    reward_failures,
)
from actors.sampling import build_groups, check_scoring
from exgrpo.core.names import sampler_name
from exgrpo.core.records import GenerationRequest, Group, Prompt, RolloutResult
from exgrpo.data.templates import render_prompt, reward_mode
from exgrpo.transport.packed import PackedWeights, unpack_weights
from exgrpo.verify.rewards import make_scorer


class ContinuousSampler:
    def __init__(
        self,
        *,
        index: int,
        engine: EngineSpec,
        settings: SamplerSettings,
        replay: Any = None,
        version_timeout_s: float = 600.0,
    ) -> None:
        """`version_timeout_s`: the longest wait of a request for its admission version."""
        torch.set_num_threads(1)
        s = settings
        self.name = sampler_name(index)
        if engine.kind != "vllm" or engine.weight_transfer is not None or engine.tensor_parallel_size != 1:
            raise ValueError(
                f"{self.name}: the continuous sampler runs one vLLM engine (samplers.engine=vllm, "
                "tensor_parallel_size=1) fed by the object-store transport (async.weight_sync=object_store)"
            )
        check_positions(engine)
        vllm = make_engine(
            "vllm", engine.model_path, dtype=engine.dtype, seed=s.seed, **engine_kwargs(engine)
        )
        self.engine = ContinuousEngine(vllm)  # type: ignore[arg-type]
        self.tokenizer = vllm.tokenizer
        self.template = s.template
        self.max_response_len = s.max_response_len
        self.temperature, self.top_p = s.temperature, s.top_p
        self.verifier = make_scorer(s.reward_fn, mode=reward_mode(s.template), timeout_s=s.verify_timeout_s)
        self._noted: set[str] = set()  # kinds of reward failure already reported to the driver
        self.replay = replay
        self._push = CoalescedPush(replay.push) if replay is not None else None
        self._seed = s.seed
        self.seeded = s.seeded  # False: vLLM's batched sampler instead of its per-sequence seeded path
        self.rollouts_per_question = s.rollouts_per_question
        self.version_timeout_s = version_timeout_s
        self.weight_load_s = 0.0
        self._verify_lock: asyncio.Lock | None = None
        self._versions: asyncio.Condition | None = None

    # -- RLlib's FaultTolerantActorManager sends every call through `apply` and probes with `ping` ----
    def ping(self) -> str:
        return "pong"

    async def apply(self, func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        out = func(self, *args, **kwargs)
        return await out if inspect.isawaitable(out) else out

    # -- the verb --------------------------------------------------------------------------------------
    async def generate(
        self,
        *,
        requests: Sequence[GenerationRequest],
        max_tokens: int | None = None,
        ignore_eos: bool = False,
    ) -> RolloutResult:
        """Generate, verify and push `requests` (each pushed as soon as its own group is done); returns
        when all are. For tests and benchmarks (the pool passes neither): `max_tokens` caps these
        responses (default `model.max_response_len`), `ignore_eos` makes them exactly that long (an
        eos token is sampled and recorded like any other; log-probs are unchanged)."""
        t0 = time.perf_counter()
        cap = max_tokens or self.max_response_len
        done = await asyncio.gather(*(self._one(r, cap, ignore_eos) for r in requests))
        groups = [g for g, _, _ in done]
        return RolloutResult(
            sampler=self.name,
            request_ids=tuple(r.request_id for r in requests),
            policy_version=min((g.policy_version for g in groups), default=self.engine.version),
            tokens=sum(len(t.response_ids) for g in groups for t in g.trajectories),
            gen_time_s=time.perf_counter() - t0 - sum(v for _, v, _ in done),
            verify_time_s=sum(v for _, v, _ in done),
            groups=tuple(groups) if self.replay is None else (),
            reward_failures=sum(f for _, _, f in done),
            reward_failure_notes=new_failure_notes(self.verifier, self._noted),
        )

    async def _one(
        self, req: GenerationRequest, max_tokens: int, ignore_eos: bool
    ) -> tuple[Group, float, int]:
        """One request: wait for its admission version, generate, score, push. Returns (group, verify s,
        reward failures)."""
        await self._wait_version(req.admitted_version)
        version = self.engine.version
        text = self.render(req.prompt)
        prompt_ids = tuple(self.engine.engine.tokenize(text))
        seed = (
            request_seed(self._seed, req.request_id, self.rollouts_per_question, n=req.n)
            if self.seeded
            else None
        )
        comps = await self.engine.generate(
            prompt_ids,
            self._params(req.n, max_tokens, self.temperature, seed, ignore_eos=ignore_eos),
            request_id=f"r{req.request_id}",
        )
        t1 = time.perf_counter()
        rewards, failures = await self._score([req.prompt] * len(comps), comps)
        group = build_groups([req], [prompt_ids], [comps], rewards, versions=[version])[0]
        if self._push is not None:  # with the groups that finish while a push is out: one call for all
            await self._push.push(group)
        return group, time.perf_counter() - t1, failures

    async def _score(self, prompts: Sequence[Prompt], comps: Sequence[Completion]) -> tuple[list[float], int]:
        if self._verify_lock is None:
            self._verify_lock = asyncio.Lock()
        async with self._verify_lock:
            return await asyncio.to_thread(self._score_now, prompts, [c.text for c in comps])

    def _score_now(self, prompts: Sequence[Prompt], texts: Sequence[str]) -> tuple[list[float], int]:
        before = reward_failures(self.verifier)
        rewards = self.verifier.score_prompts(prompts, texts)
        return rewards, reward_failures(self.verifier) - before

    def _params(
        self, n: int, max_tokens: int, temperature: float, seed: int | None, *, ignore_eos: bool = False
    ) -> Any:
        from vllm import SamplingParams

        return SamplingParams(
            n=n,
            max_tokens=max_tokens,
            temperature=temperature,
            top_p=self.top_p,
            top_k=-1,
            logprobs=0,
            seed=seed,
            skip_special_tokens=True,
            ignore_eos=ignore_eos,
        )

    async def _wait_version(self, version: int) -> None:
        if self.engine.version >= version:
            return
        if self._versions is None:
            self._versions = asyncio.Condition()
        async with self._versions:
            try:
                await asyncio.wait_for(
                    self._versions.wait_for(lambda: self.engine.version >= version), self.version_timeout_s
                )
            except TimeoutError:
                raise RuntimeError(
                    f"{self.name}: a request admitted at version {version} waited {self.version_timeout_s:.0f} s "
                    f"for those weights; this sampler serves version {self.engine.version}"
                ) from None

    # -- evaluation ------------------------------------------------------------------------------------
    async def evaluate(
        self,
        *,
        prompts: Sequence[Prompt],
        n: int = 1,
        temperature: float | None = None,
        max_tokens: int | None = None,
    ) -> list[tuple[float, ...]]:
        """Rewards of n samples per prompt (Avg@n / Pass@n), generated alongside any training requests;
        prompt i's sample j has seed run seed + i * n + j (as `VLLMEngine.generate`). Nothing is pushed."""
        temp = self.temperature if temperature is None else temperature
        check_scoring(self.verifier, n=n, temperature=temp, template=self.template)
        drawn = 1 if temp == 0 else n  # greedy: one decode, repeated n times
        stamp = time.monotonic_ns()

        async def one(i: int, prompt: Prompt) -> list[Completion]:
            ids = self.engine.engine.tokenize(self.render(prompt))
            seed = self._seed + i * drawn if self.seeded else None
            params = self._params(drawn, max_tokens or self.max_response_len, temp, seed)
            return await self.engine.generate(ids, params, request_id=f"eval-{stamp}-{i}")

        outs = await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))
        flat = [c for comps in outs for c in comps]
        rewards, _ = await self._score([p for p in prompts for _ in range(drawn)], flat)
        return [tuple(rewards[i * drawn : (i + 1) * drawn]) * (n // drawn) for i in range(len(prompts))]

    def render(self, prompt: Prompt) -> str:
        return render_prompt(prompt.question, template=self.template, tokenizer=self.tokenizer)

    # -- weights ---------------------------------------------------------------------------------------
    async def load_weights(self, *, weights: PackedWeights, version: int) -> float:
        """Object-store transport: apply rank 0's weights between two engine steps; returns seconds."""
        t0 = time.perf_counter()
        await self.engine.load_weights(unpack_weights(weights), version=version)
        if self._versions is None:
            self._versions = asyncio.Condition()
        async with self._versions:
            self._versions.notify_all()
        self.weight_load_s = time.perf_counter() - t0
        return self.weight_load_s

    def version(self) -> int:
        return self.engine.version

    def in_flight(self) -> int:
        """Requests generating now (tests, metrics)."""
        return self.engine.in_flight()

    def engine_steps(self) -> int:
        """Engine steps run so far (tests: where a response is)."""
        return self.engine.steps

    def tensor_parallel_size(self) -> int:
        return 1

    async def checksum(self) -> float:
        return await self.engine.checksum()

    def close(self) -> None:
        self.engine.close()
        self.verifier.close()
