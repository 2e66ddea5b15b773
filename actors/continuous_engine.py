"""`ContinuousEngine`: continuous batching over a `VLLMEngine`, with weight updates between two engine steps.

It drives the offline engine one scheduler step at a time (`LLMEngine.add_request` / `step`), so requests join the
running batch when they arrive and each returns the moment it finishes. Invariants: every call into vLLM runs on
one engine thread in queue order, so a weight load waits for at most one engine step, never for a response; after
a load the running requests are recomputed under the new weights, and each token's recorded version is the one
that sampled it. Why not `AsyncLLM`: docs/architecture.md ("Deviations from the paper and the official code");
more in its "Continuous sampler"; tests: tests/integration/test_continuous_sampler.py.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from actors.engines import Completion, WeightValue
from actors.vllm_engine import VLLMEngine


class ContinuousEngine:
    """A `VLLMEngine` driven step by step from an asyncio loop (one engine thread)."""

    def __init__(self, engine: VLLMEngine) -> None:
        self.engine = engine
        self.core = engine.llm.llm_engine  # vLLM's LLMEngine: add_request / step / reset_prefix_cache
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="exgrpo-vllm")
        self._waiting: dict[str, asyncio.Future[Any]] = {}  # our request id -> its final output
        self._work: asyncio.Event | None = None
        self._stepper: asyncio.Task[None] | None = None
        self.steps = 0  # engine steps run (for tests and metrics)
        self.core.set_weight_version(str(engine.version))

    @property
    def version(self) -> int:
        return self.engine.version

    def in_flight(self) -> int:
        """Requests added and not finished."""
        return len(self._waiting)

    async def _call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._thread, functools.partial(fn, *args, **kwargs))

    async def generate(self, prompt_ids: Sequence[int], params: Any, *, request_id: str) -> list[Completion]:
        """One request (`params`: vLLM `SamplingParams`, n samples): its completions once all n are done.

        Each `Completion` carries `version_spans`: ((first token, version), ...) of its token ranges."""
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        params.output_kind = RequestOutputKind.FINAL_ONLY  # one output per request, when it finishes
        prompt = TokensPrompt(prompt_token_ids=list(prompt_ids))
        if request_id in self._waiting:
            raise ValueError(f"request {request_id!r} is already generating on this engine")
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._waiting[request_id] = future  # before any step can finish it
        try:
            await self._call(self.core.add_request, request_id, prompt, params)
            self._start()
            output = await future
        finally:
            self._waiting.pop(request_id, None)
        return [_completion(c) for c in sorted(output.outputs, key=lambda c: c.index)]

    def _start(self) -> None:
        if self._work is None:
            self._work = asyncio.Event()
        self._work.set()
        if self._stepper is None or self._stepper.done():
            self._stepper = asyncio.get_running_loop().create_task(self._step_loop())

    async def _step_loop(self) -> None:
        """Step while requests are unfinished; hand each finished request to its waiter. An engine error
        fails every waiting request (the sampler's calls raise; the pool replaces the sampler)."""
        assert self._work is not None
        try:
            while True:
                if not self._waiting:
                    self._work.clear()
                    await self._work.wait()
                    continue
                outputs = await self._call(self.core.step)
                self.steps += 1
                for out in outputs:  # vLLM reports the request id it was given
                    future = self._waiting.get(out.request_id) if out.finished else None
                    if future is not None and not future.done():
                        future.set_result(out)
        except Exception as err:
            for future in list(self._waiting.values()):
                if not future.done():
                    future.set_exception(RuntimeError(f"the vLLM engine failed: {err!r}"))
            raise

    async def load_weights(self, weights: Mapping[str, WeightValue], *, version: int) -> None:
        """Apply new weights after the engine step in flight (see the module docstring)."""
        await self._call(self._apply, weights, version)

    def _apply(self, weights: Mapping[str, WeightValue], version: int) -> None:
        if version < self.engine.version:  # Ray started this load after a newer one: stale, skipped
            return
        self.engine.load_weights(weights, version=version)  # today's object-store loader, by name
        if not self.core.reset_prefix_cache(reset_running_requests=True):
            raise RuntimeError("vLLM could not reset its KV cache after a weight load")
        self.core.set_weight_version(str(version))

    async def checksum(self) -> float:
        return float(await self._call(self.engine.checksum))

    def close(self) -> None:
        if self._stepper is not None:
            self._stepper.cancel()
        self._thread.shutdown(wait=False, cancel_futures=True)


def _completion(c: Any) -> Completion:
    """vLLM's `CompletionOutput` -> our `Completion`, with its version spans."""
    ids = tuple(c.token_ids)
    lps = tuple(float(step[tok].logprob) for tok, step in zip(ids, c.logprobs, strict=True))
    spans = c.weight_versions
    if spans is None and ids:
        raise RuntimeError("vLLM returned no weight-version spans for a completion")
    version_spans = tuple((int(s.start), int(s.version)) for s in spans or ())
    return Completion(
        token_ids=ids,
        logprobs=lps,
        text=c.text,
        finish_reason="stop" if c.finish_reason == "stop" else "length",
        version_spans=version_spans,
    )
