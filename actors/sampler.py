"""Sampler: one generation engine plus the reward (the answer verifier, or the run's `reward.fn`).

`generate(requests=...)` turns generation requests into verified `Group`s tagged with the version of the weights
that sampled them, pushes them to the replay shards and reports a `RolloutResult`. Invariants: new weights land
between engine calls, in submission order; a failed weight write leaves it refusing requests (`WeightsFailed`)
until a full load succeeds; request r's completions have seeds no other request shares and that depend on the run
seed and r only (`actors.sampler_common.request_seed`), so a resumed run draws the same. More: docs/architecture.md
("One step, hop by hop", "Weights"); tests: tests/actors/test_sampler.py, tests/actors/test_sampler_seeds_overlap.py.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import ray
import torch

from actors.engine_gate import EngineGate, LateWeightUpdate, WeightsFailed
from actors.engines import TokenizingEngine
from actors.factory import make_engine
from actors.load_faults import load_fault
from actors.sampler_common import (
    EngineSpec,
    SamplerSettings,
    check_positions,
    engine_kwargs,
    new_failure_notes,
    request_seed,
    reward_failures,
)
from actors.sampling import build_groups, generate_scored, sample_rewards, verifier_workers
from exgrpo.core.cores import Lender, job_ledger
from exgrpo.core.faults import fault_point
from exgrpo.core.names import sampler_name
from exgrpo.core.records import GenerationRequest, Prompt, RolloutResult
from exgrpo.data.templates import render_prompt, reward_mode
from exgrpo.transport.packed import PackedWeights, unpack_weights
from exgrpo.verify.rewards import make_scorer

WEIGHTS = "weights"  # the concurrency group of the weight-transfer control calls (see below)
PROBE = "probe"  # the group of `weight_call`, which answers while a control call hangs

# EngineSpec, SamplerSettings, check_positions, new_failure_notes and request_seed live in actors.sampler_common
# (shared with the continuous sampler) and stay importable from here
__all__ = [
    "WEIGHTS",
    "EngineSpec",
    "LateWeightUpdate",
    "Sampler",
    "SamplerSettings",
    "WeightsFailed",
    "check_positions",
    "new_failure_notes",
    "request_seed",
]


class Sampler:
    CONCURRENCY_GROUPS = {WEIGHTS: 1, PROBE: 1}  # `exgrpo.runtime.env.remote_actor` passes it to Ray

    def __init__(
        self,
        *,
        index: int,
        engine: EngineSpec,
        settings: SamplerSettings,
        replay: Any = None,
        verify_workers: int | None = None,
        overlap_verify: bool | None = None,
    ) -> None:
        """`verify_workers`: verifier processes (None: `verifier_workers`). `overlap_verify`: score requests as
        they finish (`generate_scored`; None: with 2+ verifier workers)."""
        torch.set_num_threads(1)
        s = settings
        self.name = sampler_name(index)
        check_positions(engine)  # before minutes of engine start-up
        self.tp = engine.tensor_parallel_size
        self.engine: TokenizingEngine = make_engine(
            engine.kind, engine.model_path, dtype=engine.dtype, seed=s.seed, **engine_kwargs(engine)
        )
        self.template = s.template
        self.max_response_len = s.max_response_len
        self.temperature, self.top_p = s.temperature, s.top_p
        self.verify_workers = verifier_workers(verify_workers)
        self.verifier = make_scorer(
            s.reward_fn,
            mode=reward_mode(s.template),
            timeout_s=s.verify_timeout_s,
            workers=self.verify_workers,
        )
        self.seeded = s.seeded  # False: requests carry no seed
        self.overlap_verify = self.verify_workers >= 2 if overlap_verify is None else overlap_verify
        self._noted: set[str] = set()  # kinds of reward failure already reported to the driver
        self.replay = replay
        self._seed = s.seed
        self.rollouts_per_question = s.rollouts_per_question  # K: the seed stride of a request
        self._update_start = time.perf_counter()
        self.weight_load_s = 0.0  # time spent applying the last weights
        self.gate = self._new_gate()
        self.transfer_inits = self.transfer_shutdowns = 0
        self.weight_sums = s.weight_sums and self.tp == 1  # per-layer sums of one engine's whole weights
        self._served: tuple[int, tuple[tuple[str, float], ...]] = (-1, ())  # (version, layer sums) loaded

    # -- hooks of ray.rllib's FaultTolerantActorManager (it sends every call, even by method name, through
    # `apply`, and probes health with `ping`) --------------------------------------------------------------
    def ping(self) -> str:
        return "pong"

    def apply(self, func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return func(self, *args, **kwargs)

    # -- the verb ----------------------------------------------------------------------------------
    def generate(self, *, requests: Sequence[GenerationRequest]) -> RolloutResult:
        """Sample, verify and push one batch of requests; returns a small summary."""
        with self.gate.engine():
            return self._generate(requests)

    def _generate(self, requests: Sequence[GenerationRequest]) -> RolloutResult:
        """`verify_time_s`: what verification added beyond generation (engine call's end to the last reward)."""
        texts = [self.render(r.prompt) for r in requests]
        version = self.engine.version
        seeds = [request_seed(self._seed, r.request_id, self.rollouts_per_question, n=r.n) for r in requests]
        failed_before = reward_failures(self.verifier)
        scored = generate_scored(
            self.engine,
            self.verifier,
            [r.prompt for r in requests],
            texts,
            overlap=self.overlap_verify,
            threads=self.verify_workers + 1,
            after_generate=lambda: fault_point("sampler.generate"),
            n=[r.n for r in requests],
            max_tokens=self.max_response_len,
            temperature=self.temperature,
            top_p=self.top_p,
            seed=seeds if self.seeded else None,
        )
        outs, rewards = scored.outs, scored.rewards
        failures = reward_failures(self.verifier) - failed_before
        flat = [c for comps in outs for c in comps]
        prompt_ids = [self.engine.tokenize(text) for text in texts]
        groups = build_groups(requests, prompt_ids, outs, rewards, versions=[version] * len(requests))
        if self.replay is not None:
            self.replay.push(groups=groups)
            fault_point("sampler.push")
        return RolloutResult(
            sampler=self.name,
            request_ids=tuple(r.request_id for r in requests),
            policy_version=version,
            tokens=sum(len(c.token_ids) for c in flat),
            gen_time_s=scored.gen_time_s,
            verify_time_s=scored.verify_time_s,
            groups=tuple(groups) if self.replay is None else (),
            reward_failures=failures,
            reward_failure_notes=new_failure_notes(self.verifier, self._noted),
            served_sums=self._served[1] if self._served[0] == version else (),
        )

    def evaluate(
        self,
        *,
        prompts: Sequence[Prompt],
        n: int = 1,
        temperature: float | None = None,
        max_tokens: int | None = None,
    ) -> list[tuple[float, ...]]:
        """Rewards of n samples per prompt (for Avg@n / Pass@n); nothing is pushed to replay."""
        with self.gate.engine():
            return self._evaluate(prompts, n=n, temperature=temperature, max_tokens=max_tokens)

    def _evaluate(
        self, prompts: Sequence[Prompt], *, n: int, temperature: float | None, max_tokens: int | None
    ) -> list[tuple[float, ...]]:
        fault_point("sampler.evaluate")
        return sample_rewards(
            self.engine,
            self.verifier,
            prompts,
            n=n,
            template=self.template,
            max_tokens=max_tokens or self.max_response_len,
            temperature=self.temperature if temperature is None else temperature,
            top_p=self.top_p,
            seed=self._seed if self.seeded else None,
            tokenizer=self.engine.tokenizer,
        )

    def render(self, prompt: Prompt) -> str:
        # chat/think templates use the engine's own tokenizer (its chat template), loaded once
        return render_prompt(prompt.question, template=self.template, tokenizer=self.engine.tokenizer)

    # -- weights -----------------------------------------------------------------------------------
    def load_weights(self, *, weights: PackedWeights, version: int) -> float:
        """Object-store transport: apply rank 0's packed weights (views of the shared object); returns seconds."""
        t0 = time.perf_counter()
        # a failed broadcast's fallback: ends its session first; a load also repairs a failed one
        with self.gate.engine(wait_session=False, serving=False), self.gate.at_stake("load_weights"):
            state = unpack_weights(weights)
            if not load_fault(self.engine, state, version=version, sampler=self.name):  # tests only
                self.engine.load_weights(state, version=version)
            self._sum_served()
        self.weight_load_s = time.perf_counter() - t0
        return self.weight_load_s

    def _sum_served(self) -> None:
        """Right after a load or update, inside the engine: the per-layer sums of what it now serves, sent with
        every result sampled at this version (`exgrpo.loop.weight_checks` compares them with the learner's)."""
        if self.weight_sums:
            layer_sums = getattr(self.engine, "layer_sums", None)
            if layer_sums is None:
                raise RuntimeError(
                    f"{self.name}: {type(self.engine).__name__} cannot sum its served weights; "
                    "set checks.checksum=false"
                )
            self._served = (self.engine.version, layer_sums())

    def _new_gate(self) -> EngineGate:
        """The engine's gate; on a CPU sampler in a Ray job it marks the core busy in the node's ledger while a call
        holds the engine, so a learner may borrow it in between (`exgrpo.core.cores`)."""
        ctx = ray.get_runtime_context() if ray.is_initialized() else None
        ledger = (
            job_ledger(ctx.get_job_id(), ctx.get_node_id()) if ctx and not torch.cuda.is_available() else None
        )
        lender = None
        if ledger is not None:
            lender = Lender(ledger, cores=1)  # the engine computes on one thread (`torch.set_num_threads(1)`)
            lender.mark(False)
        return EngineGate(
            self.name,
            end_session=lambda: self._vllm().finish_weight_update(version=self.engine.version),
            on_busy=None if lender is None else lender.mark,
        )

    @property
    def weights_failed(self) -> str | None:
        """Why the last weight load or update failed (None: the served weights are whole)."""
        return self.gate.weights_failed

    # vLLM's weight-transfer control plane (`exgrpo.transport.vllm_api.SamplerClient` calls these in this order).
    #
    # They run in the actor's own concurrency group (`WEIGHTS`), so they do not queue behind the generate
    # calls waiting in the default group: `EngineGate.control` waits for at most the one engine call in flight.
    # While a session is open (start .. finish) the default group's engine calls wait for it (`EngineGate.engine`).
    # Each call carries the caller's `deadline` (wall clock, `time.time()`): one that gets its turn after it
    # is refused instead of run, so a late `start_weight_update` never moves the layers to the meta device
    # after the learner gave up. A session that was started and not finished (the broadcast failed, or its
    # deadline passed) is ended by the next engine call (`EngineGate.close_session`: vLLM puts the unloaded
    # layers' old tensors back); the transport's fallback `load_weights` of that version (object store) then
    # overwrites every weight. If the session had received weights, the engine serves no request in between.
    @ray.method(concurrency_group=WEIGHTS)
    def init_weight_transfer_engine(
        self, *, init_info: dict[str, Any], deadline: float | None = None
    ) -> None:
        fault_point("sampler.transfer_init")
        with self.gate.control("init_weight_transfer_engine", deadline):
            self.gate.close_session()
            try:
                if self.transfer_inits > 0:  # vLLM's release of the previous world before this one (no leak)
                    self._vllm().shutdown_weight_transfer()
                    self.transfer_shutdowns += 1
                self._vllm().init_weight_transfer(init_info)
            except BaseException:
                self.gate.unreserve()  # no world: serve requests again
                raise
            self.transfer_inits += 1

    @ray.method(concurrency_group=WEIGHTS)
    def start_weight_update(self, *, deadline: float | None = None) -> None:
        with self.gate.control("start_weight_update", deadline):
            self.gate.close_session()
            self._update_start = time.perf_counter()
            self.gate.open_session(deadline)
            self._vllm().start_weight_update()

    @ray.method(concurrency_group=WEIGHTS)
    def update_weights(self, *, update_info: dict[str, Any], deadline: float | None = None) -> None:
        with self.gate.control("update_weights", deadline, session=True):
            self.gate.session_loading()
            try:
                fault_point("sampler.update_weights")
                self._vllm().update_weights(update_info)
            except BaseException as e:
                # vLLM's worker has dropped its session without finishing the layerwise reload (layers may
                # be on the meta device, and it refuses `finish_weight_update`): finish the reload here
                self.gate.session_failed(e)
                self._vllm().end_failed_update()
                raise

    @ray.method(concurrency_group=WEIGHTS)
    def finish_weight_update(self, *, version: int, deadline: float | None = None) -> float:
        """Finish the update, tag later trajectories with `version`; returns seconds since the start."""
        with (
            self.gate.control("finish_weight_update", deadline, session=True),
            self.gate.at_stake("finish_weight_update"),
        ):
            try:
                self._vllm().finish_weight_update(version=version)
            finally:
                self.gate.finish_session()
            self._sum_served()
        self.weight_load_s = time.perf_counter() - self._update_start
        return self.weight_load_s

    @ray.method(concurrency_group=WEIGHTS)
    def join_world(self, *, deadline: float | None = None) -> bool:
        """Acknowledge a new weight-transfer world before learner rank 0 opens it: returns once the engine is
        free to join (after the one call in flight), refused past `deadline`, and holds the engine for the
        world from then on: no engine call starts until the world's first update has started (a failed init
        or `deadline` releases it), so the rendezvous never waits behind a generate call."""
        with self.gate.control("join_world", deadline):
            self.gate.reserve(deadline)
            return True

    @ray.method(concurrency_group=PROBE)
    def weight_call(self) -> tuple[str, float] | None:
        """The weight-transfer control call running now and its seconds past its deadline (None: none). The
        transport kills a sampler whose call outlived its version's deadline (`VLLMTransport`)."""
        return self.gate.overdue()

    @ray.method(concurrency_group=WEIGHTS)
    def transfer_stats(self) -> dict[str, int]:
        """Weight-transfer engines built and released, and updates abandoned half-way (for the tests and metrics)."""
        return {
            "inits": self.transfer_inits,
            "shutdowns": self.transfer_shutdowns,
            "aborted_updates": self.gate.aborted,
            "refused": self.gate.refused,
            "open": int(self.gate.session_open),
        }

    def _vllm(self) -> Any:
        if not hasattr(self.engine, "init_weight_transfer"):
            raise RuntimeError(f"{self.name}: vLLM's weight-transfer API needs samplers.engine=vllm")
        return self.engine

    def version(self) -> int:
        return self.engine.version

    @ray.method(concurrency_group=WEIGHTS)
    def tensor_parallel_size(self) -> int:
        """Workers of this sampler's engine: its ranks in vLLM's weight-transfer world (`transfer_ranks`)."""
        return self.tp

    def checksum(self) -> float:
        with self.gate.engine(serving=False):  # what the engine serves, whatever state it is in
            return self.engine.checksum()

    def close(self) -> None:
        self.verifier.close()
