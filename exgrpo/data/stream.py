"""PromptStream: the fresh-question iterator (seeded epochs, retired questions skipped).

Each epoch is a seeded permutation of the training prompts minus the questions retired by the
time the epoch starts (a question solved K/K is skipped from its next epoch). The position is part
of the checkpointed driver state.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from exgrpo.core.records import Prompt


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

    def _new_epoch(self) -> None:
        self.epoch += 1
        self.position = 0
        gone = self._retired()
        perm = np.random.default_rng([self.seed, self.epoch]).permutation(len(self.prompts))
        self._order = [int(i) for i in perm if self.prompts[i].qid not in gone]
        if not self._order:
            raise StopIteration("every training question is retired (solved K/K); nothing left to train on")

    def next(self, n: int) -> list[Prompt]:
        """The next n prompts, crossing epoch boundaries as needed."""
        out: list[Prompt] = []
        while len(out) < n:
            if self.position >= len(self._order):
                self._new_epoch()
            take = self._order[self.position : self.position + n - len(out)]
            self.position += len(take)
            out += [self.prompts[i] for i in take]
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "position": self.position, "order": list(self._order)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch, self.position, self._order = (
            int(state["epoch"]),
            int(state["position"]),
            list(state["order"]),
        )
