"""Builtin tasks drawn from reasoning-gym (PyPI `reasoning-gym`): seeded, difficulty-graded procedural tasks.

`GymTask` wraps one reasoning-gym generator as a builtin `data.train` source (registered in
`exgrpo.data.tasks.BUILTIN_TASKS`). Invariants: a keyed hash of the question (`EVAL_SHARE` held out) keeps every
eval question out of every train split, whatever the seed; splits are seeded and prefix-stable, questions unique
within a split. Scoring is the run's `reward.fn`, not reasoning-gym's partial credit. More: docs/data.md
("Builtin tasks"), docs/smollm2.md ("A task at the model's level"); tests: tests/exgrpo/data/test_gym_tasks.py.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from exgrpo.core.records import Prompt

EVAL_SHARE = 8  # one question in EVAL_SHARE (by hash) belongs to the held-out eval part
_HASH_KEY = b"exgrpo-gym-v1"  # fixed: changing it re-partitions the question space
_SPLIT_STREAM = {"train": 0, "eval": 1}
_MAX_DRAWS = 1_000_000  # the draws one split may try before it gives up (a question space too small)


def in_eval_part(key: str) -> bool:
    """True if the question (its expression) belongs to the held-out part of the question space."""
    digest = hashlib.blake2b(key.encode("utf-8"), digest_size=8, key=_HASH_KEY).digest()
    return int.from_bytes(digest, "big") % EVAL_SHARE == 0


def split_key(item: dict[str, Any]) -> str:
    """What the held-out split hashes: the item's expression ("4 - 1"), else its question text."""
    metadata = item.get("metadata") or {}
    expression = metadata.get("expression") if isinstance(metadata, dict) else None
    return str(expression) if expression else str(item["question"])


def _reasoning_gym() -> Any:
    try:
        import reasoning_gym
    except ImportError as err:  # a dependency of the package; missing only in a partial install
        raise ImportError("builtin reasoning-gym tasks need `pip install reasoning-gym`") from err
    return reasoning_gym


@dataclass(frozen=True)
class GymTask:
    """One reasoning-gym generator with fixed difficulty parameters (`params`, its config's fields)."""

    dataset: str = "chain_sum"  # reasoning-gym's dataset name
    params: tuple[tuple[str, Any], ...] = (
        ("min_terms", 2),
        ("max_terms", 2),
        ("min_digits", 1),
        ("max_digits", 1),
    )
    seed: int = 0  # default seed of make_split
    name: str = "sum-1digit"

    def items(self, *, seed: int, count: int) -> Any:
        """reasoning-gym's dataset of `count` items drawn with `seed` (item i from Random(seed + i))."""
        return _reasoning_gym().create_dataset(self.dataset, size=count, seed=seed, **dict(self.params))

    def make_split(self, *, split: str, n: int, seed: int | None = None) -> list[Prompt]:
        """n prompts of `split` ("train" or "eval"); deterministic in (split, n, seed) and prefix-stable."""
        if split not in _SPLIT_STREAM:
            raise ValueError(f"split={split!r} must be 'train' or 'eval'")
        if n < 0:
            raise ValueError(f"n={n} must be >= 0")
        seed = self.seed if seed is None else seed
        data = self.items(seed=seed * 1000 + _SPLIT_STREAM[split], count=_MAX_DRAWS)
        want_eval = split == "eval"
        prompts: list[Prompt] = []
        seen: set[str] = set()
        misses = 0  # draws in a row that gave nothing new: the split's part of the space is exhausted
        for i in range(_MAX_DRAWS):
            if len(prompts) == n:
                break
            item = data[i]
            key = split_key(item)
            if key in seen or in_eval_part(key) != want_eval:
                misses += 1
                if misses > 2000 + 50 * n:
                    break
                continue
            misses = 0
            seen.add(key)
            prompts.append(
                Prompt(
                    qid=f"{self.name}-{split}-{len(prompts):05d}",
                    question=str(item["question"]),
                    answer=str(item["answer"]).strip(),
                    data_source=self.name,
                    fields={"expression": key},
                )
            )
        if len(prompts) < n:
            raise RuntimeError(
                f"builtin:{self.name} has only {len(prompts)} distinct {split} questions (asked for {n}); "
                "ask for fewer (data.num_train / data.num_eval)"
            )
        return prompts

    def solution_text(self, prompt: Prompt) -> str:
        """A worked solution in the requested format, the cold start's target (exgrpo/models/cold_start.py):
        `0 - 4 = -4.\nThe answer is \\boxed{-4}.` (the expression line only where the item has one)."""
        from exgrpo.verify.answers import boxed

        expression = prompt.fields.get("expression")
        work = f"{expression} = {prompt.answer}.\n" if expression else ""
        return f"{work}The answer is {boxed(prompt.answer)}."

    def difficulty(self, prompt: Prompt) -> int:
        """Operands + digits of the longest operand - 3 ("4 - 1" -> 0; "47 + 5" -> 1)."""
        key = str(prompt.fields.get("expression") or prompt.question)
        numbers = [t for t in key.replace("(", " ").replace(")", " ").split() if t.lstrip("-").isdigit()]
        if not numbers:
            return 0
        return len(numbers) + max(len(t.lstrip("-")) for t in numbers) - 3


# builtin task names -> factories (seed=...) for `exgrpo.data.tasks.BUILTIN_TASKS`
GYM_TASKS: dict[str, Callable[..., GymTask]] = {
    "sum-1digit": lambda seed=0: GymTask(seed=seed),
    # chain sums of 2-3 terms of 1-2 digits: a question space far past any split (the 1-digit pairs have 200
    # questions in all) and a spread of difficulty for a small model (docs/smollm2.md, "A spread of difficulty")
    "sum-mixed": lambda seed=0: GymTask(
        seed=seed,
        name="sum-mixed",
        params=(("min_terms", 2), ("max_terms", 3), ("min_digits", 1), ("max_digits", 2)),
    ),
}
