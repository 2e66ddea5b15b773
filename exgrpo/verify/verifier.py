"""Rewards: math verification of a response's final answer against the gold answer.

reward = 1.0 when the response's final answer is equivalent to the gold (math-verify's equivalence, gold first),
else 0.0, and 0.0 on any failure (no answer, unreadable text, a worker crash, the deadline). `Verifier`, `score`
and `score_many` are the public API; `exgrpo.verify.answers` finds the answer, `exgrpo.verify.pool` runs the
comparison under a hard deadline. Fast paths never turn a wrong answer right. The rules: docs/rewards.md;
tests: tests/exgrpo/verify/test_rewards.py, tests/exgrpo/verify/test_reference_agreement.py.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import get_args

from exgrpo.core.config import RewardMode
from exgrpo.core.records import Prompt
from exgrpo.verify.answers import (
    BOX_COMMAND,
    BOX_OPEN,
    answer_region,
    boxed,
    clean_gold,
    equation_values,
    extract_answer,
    final_answer,
    last_boxed,
    normalize,
)
from exgrpo.verify.pool import Job, Pool

__all__ = [
    "BOX_COMMAND",
    "BOX_OPEN",
    "Verifier",
    "VerifierStats",
    "boxed",
    "extract_answer",
    "last_boxed",
    "score",
    "score_many",
]

_INTEGER = re.compile(r"([+-]?)0*(\d+)", re.ASCII)
TEXT_TAIL_CHARS = 4000  # no box: the last characters of the answer region go to math-verify's extraction


def _fast_verdict(answer: str, gold: str) -> bool | None:
    """True/False when decidable without parsing (identical strings, two integers), else None."""
    if answer == gold:
        return True
    a, g = _INTEGER.fullmatch(answer), _INTEGER.fullmatch(gold)
    if a is None or g is None:
        return None
    a_sign = a.group(1) == "-" and a.group(2) != "0"
    g_sign = g.group(1) == "-" and g.group(2) != "0"
    return a_sign == g_sign and a.group(2) == g.group(2)


@dataclass(frozen=True)
class VerifierStats:
    """Counters since the Verifier was made (for `rollout/` metrics)."""

    scored: int  # responses scored
    fast: int  # decided without a worker: no answer, identical, two integers, rejected, or too long
    timeouts: int  # worker verifications killed at the deadline (each scored 0)
    failures: dict[str, int] | None = None  # by kind: "timed out"
    first_failures: dict[str, str] | None = None  # kind -> the first one's text


class Verifier:
    """Scores responses against gold answers; owns a pool of verification workers.

    timeout_s is a hard wall-clock limit per answer, counted from its dispatch to a worker.
    Answers longer than max_answer_chars score 0 unparsed (None: no limit). max_memory_mb caps
    each worker's address space (None: no cap). Calls from several threads run at once, up to
    `workers` verifications in parallel; one more worker process stands by (exgrpo.verify.pool).
    """

    def __init__(
        self,
        *,
        mode: RewardMode = "boxed",
        timeout_s: float = 5.0,
        workers: int = 1,
        max_answer_chars: int | None = 1000,
        fast_path: bool = True,
        max_memory_mb: int | None = 4096,
        _pool: Pool | None = None,  # share another Verifier's workers (module-level functions)
    ) -> None:
        if mode not in get_args(RewardMode):
            raise ValueError(f"mode must be 'boxed' or 'think', got {mode!r}")
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        if max_answer_chars is not None and max_answer_chars < 1:
            raise ValueError(f"max_answer_chars must be >= 1 or None, got {max_answer_chars}")
        self.mode: RewardMode = mode
        self.timeout_s = timeout_s
        self.max_answer_chars = max_answer_chars
        self.fast_path = fast_path
        self._pool = _pool or Pool(size=workers, max_memory_mb=max_memory_mb)
        self._count_lock = threading.Lock()
        self._scored = 0
        self._fast = 0

    def score(self, response: str, gold: str) -> float:
        """1.0 if the final answer of `response` is equivalent to `gold`, else 0.0; never raises
        because of the response."""
        return self.score_many([response], [gold])[0]

    def _job(self, response: object, gold: object) -> Job | bool:
        """What a worker must check for this pair, or the verdict when it is decided here."""
        if not isinstance(response, str) or not isinstance(gold, str):
            return False
        region = answer_region(response, self.mode)
        if region is None:
            return False
        gold = clean_gold(gold)
        answer = final_answer(region)
        if answer is None:  # no box: math-verify's extraction on the region's tail
            tail = region[-TEXT_TAIL_CHARS:]
            return Job("text", [tail], gold) if tail.strip() else False
        if self.max_answer_chars is not None and len(answer) > self.max_answer_chars:
            return False
        answer = normalize(answer)
        if self.fast_path and _fast_verdict(answer, gold) is True:
            return True
        values = equation_values(answer, gold)
        if values is None:
            return False
        if self.fast_path and len(values) == 1 and (verdict := _fast_verdict(values[0], gold)) is not None:
            return verdict
        return Job("values", values, gold)

    def score_prompts(self, prompts: Sequence[Prompt], completions: Sequence[str]) -> list[float]:
        """score_many against each prompt's gold answer (the reward interface of `exgrpo.verify.rewards`)."""
        return self.score_many(completions, [p.answer for p in prompts])

    def score_many(self, responses: Sequence[str], golds: Sequence[str]) -> list[float]:
        """score() for each pair, fanned out over the workers, one deadline per item."""
        if len(responses) != len(golds):
            raise ValueError(f"{len(responses)} responses but {len(golds)} golds; they must pair up")
        rewards = [0.0] * len(responses)
        jobs: list[Job] = []
        job_items: list[int] = []
        for i, (response, gold) in enumerate(zip(responses, golds, strict=True)):
            try:
                job = self._job(response, gold)
            except Exception:  # a response this module cannot read scores 0; it never raises
                job = False
            if isinstance(job, bool):
                rewards[i] = float(job)
            else:
                jobs.append(job)
                job_items.append(i)
        for i, value in zip(job_items, self._pool.run(jobs, timeout_s=self.timeout_s), strict=True):
            rewards[i] = value
        with self._count_lock:
            self._scored += len(rewards)
            self._fast += len(rewards) - len(jobs)
        return rewards

    def start(self) -> None:
        """Start the workers and wait until they are ready (~1 s); else the first call does it."""
        self._pool.start()

    def stats(self) -> VerifierStats:
        return VerifierStats(
            scored=self._scored,
            fast=self._fast,
            timeouts=self._pool.timeouts,
            failures=dict(self._pool.failures),
            first_failures=dict(self._pool.first_failures),
        )

    def close(self) -> None:
        """Kill and reap the workers; the Verifier cannot be used afterwards."""
        self._pool.close()

    def __enter__(self) -> Verifier:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


@lru_cache(maxsize=1)
def _shared_pool() -> Pool:
    return Pool(size=max(1, min(4, os.cpu_count() or 1)), max_memory_mb=4096)


@lru_cache(maxsize=16)
def _shared_verifier(mode: RewardMode, timeout_s: float) -> Verifier:
    return Verifier(mode=mode, timeout_s=timeout_s, _pool=_shared_pool())


def score(response: str, gold: str, *, mode: RewardMode = "boxed", timeout_s: float = 5.0) -> float:
    """Verifier.score on a module-wide pool of min(4, cpu_count) workers, started lazily."""
    return _shared_verifier(mode, timeout_s).score(response, gold)


def score_many(
    responses: Sequence[str], golds: Sequence[str], *, mode: RewardMode = "boxed", timeout_s: float = 5.0
) -> list[float]:
    """Verifier.score_many on a module-wide pool of min(4, cpu_count) workers, started lazily."""
    return _shared_verifier(mode, timeout_s).score_many(responses, golds)
