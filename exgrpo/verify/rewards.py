"""The reward of a run: the math verifier (`reward.fn: math`, the default) or a user's function.

Both score through `score_prompts(prompts, completions)`, the one call the samplers, their held-out evaluation and
`python -m exgrpo.evaluate` make (`make_scorer` builds the right one). A user's function runs in the verifier's
workers under the same deadline and isolation: a timeout, a raise or a non-number scores 0 and is counted by kind
(`stats()`), so nothing it does can crash a sampler. A trajectory is correct when its reward is above 0.5.
More: docs/rewards.md ("Your own reward"); tests: tests/exgrpo/verify/test_reward_plugin.py.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from exgrpo.core.config import RewardMode
from exgrpo.core.records import Prompt
from exgrpo.verify.plugin import resolve
from exgrpo.verify.pool import Job, Pool
from exgrpo.verify.verifier import Verifier

MATH = "math"  # the built-in verifier's name in reward.fn


@dataclass(frozen=True)
class RewardStats:
    """Counters since the reward was made (for `rollout/` metrics)."""

    scored: int  # completions scored
    timeouts: int  # calls killed at the deadline (each scored 0)
    errors: int  # calls that raised or returned no finite number (each scored 0)
    failures: dict[str, int] | None = None  # by kind: "raised", "not a number", "timed out"
    first_failures: dict[str, str] | None = None  # kind -> the first one's text and its row's qid


def row_fields(prompt: Prompt) -> dict[str, Any]:
    """What a reward function sees of a row: its extra columns, then `answer`, `qid` and `data_source`."""
    return {**prompt.fields, "answer": prompt.answer, "qid": prompt.qid, "data_source": prompt.data_source}


class FunctionReward:
    """A user's reward function run in `workers` isolated processes under a per-call deadline."""

    mode = None  # reads no answer region: any template goes

    def __init__(self, spec: str, *, timeout_s: float = 5.0, workers: int = 1) -> None:
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        resolved = resolve(spec)  # fail here, in the caller, with a clear message, not in a worker
        self.spec = spec
        self.timeout_s = timeout_s
        self._pool = Pool(size=workers, max_memory_mb=4096, reward_fn=spec, import_root=resolved.import_root)
        self._lock = threading.Lock()
        self._scored = 0

    def score_prompts(self, prompts: Sequence[Prompt], completions: Sequence[str]) -> list[float]:
        if len(prompts) != len(completions):
            raise ValueError(f"{len(completions)} completions but {len(prompts)} prompts; they must pair up")
        jobs = [
            Job("reward", [p.question, c if isinstance(c, str) else ""], p.answer, row_fields(p))
            for p, c in zip(prompts, completions, strict=True)
        ]
        values = self._pool.run(jobs, timeout_s=self.timeout_s)
        with self._lock:
            self._scored += len(values)
        return values

    def start(self) -> None:
        """Start the workers and wait until each has imported the function."""
        self._pool.start()

    def stats(self) -> RewardStats:
        return RewardStats(
            scored=self._scored,
            timeouts=self._pool.timeouts,
            errors=self._pool.errors,
            failures=dict(self._pool.failures),
            first_failures=dict(self._pool.first_failures),
        )

    def close(self) -> None:
        self._pool.close()

    def __enter__(self) -> FunctionReward:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def make_scorer(
    fn: str, *, mode: RewardMode, timeout_s: float, workers: int = 1
) -> Verifier | FunctionReward:
    """The reward `reward.fn` names: the math verifier reading answers in `mode` (the template's
    `exgrpo.data.templates.reward_mode`), or a user's function."""
    if fn == MATH:
        return Verifier(mode=mode, timeout_s=timeout_s, workers=workers)
    return FunctionReward(fn, timeout_s=timeout_s, workers=workers)
