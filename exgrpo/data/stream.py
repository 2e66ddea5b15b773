"""PromptStream: the fresh-question iterator (seeded epochs, retired questions skipped).

Each epoch is a seeded permutation of the training prompts minus the questions retired by the
time the epoch starts (a question solved K/K is skipped from its next epoch). The position is part
of the checkpointed driver state. One call never returns a question twice: when it crosses into a new
epoch, the questions it already holds move to the end of that epoch's order. When fewer questions are
left than a call needs (or none), it raises `OutOfQuestions`: the run has run out of work.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from exgrpo.core.records import Prompt


class OutOfQuestions(RuntimeError):
    """Every training question is retired, or fewer are left than one step needs."""


class PromptStream:
    def __init__(
        self, prompts: Sequence[Prompt], *, seed: int, retired: Callable[[], frozenset[str]] = frozenset
    ) -> None:
        if not prompts:
            raise ValueError("the training set is empty")
        self.prompts = list(prompts)
        self.seed = seed
        self._retired = retired
        self.epoch = -1
        self.position = 0
        self._order: list[int] = []

    def _new_epoch(self, *, held: frozenset[str] | set[str] = frozenset()) -> None:
        self.epoch += 1
        self.position = 0
        gone = self._retired()
        perm = np.random.default_rng([self.seed, self.epoch]).permutation(len(self.prompts))
        order = [int(i) for i in perm if self.prompts[i].qid not in gone]
        if not order:
            raise OutOfQuestions("every training question is retired (solved K/K); nothing left to train on")
        # what the current call already holds goes last, so the call never gets a question twice
        self._order = [i for i in order if self.prompts[i].qid not in held] + [
            i for i in order if self.prompts[i].qid in held
        ]

    def next(self, n: int) -> list[Prompt]:
        """The next n distinct prompts, crossing epoch boundaries as needed."""
        out: list[Prompt] = []
        held: set[str] = set()
        while len(out) < n:
            if self.position >= len(self._order):
                self._new_epoch(held=held)
            take = self._order[self.position : self.position + n - len(out)]
            if any(self.prompts[i].qid in held for i in take):
                left = len({self.prompts[i].qid for i in self._order})
                raise OutOfQuestions(
                    f"only {left} training questions are not retired; a step needs {n} distinct ones"
                )
            self.position += len(take)
            out += [self.prompts[i] for i in take]
            held.update(p.qid for p in out)
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "position": self.position, "order": list(self._order)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch, self.position, self._order = (
            int(state["epoch"]),
            int(state["position"]),
            list(state["order"]),
        )
