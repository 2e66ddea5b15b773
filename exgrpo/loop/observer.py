"""Observers of a run (`exgrpo.core.roles.RunObserver`): a no-op base to subclass, and several as one.

The driver reports to one observer; the training recipe (`exgrpo/runtime/recipe.py`) passes an `Observers`
of the metrics logger, the progress bar, the candidate log (tasks with a trace check) and the caller's own:

    class Kill(Observer):
        def on_train_start(self, *, system, driver):
            self.system = system

        def on_step(self, *, record):
            if record["step"] == 1:
                ray.kill(self.system.learners.actors[0])

    train(cfg, observer=Kill())
"""

from __future__ import annotations

from typing import Any

from exgrpo.core.records import TrainBatch
from exgrpo.core.roles import RunObserver


class Observer:
    """A `RunObserver` that does nothing: override the callbacks you need."""

    def on_train_start(self, *, system: Any, driver: Any) -> None:
        pass

    def on_batch(self, *, batch: TrainBatch) -> None:
        pass

    def on_step(self, *, record: dict[str, Any]) -> None:
        pass

    def on_eval(self, *, record: dict[str, Any]) -> None:
        pass

    def on_candidates(self, *, step: int, rows: list[dict[str, Any]]) -> None:
        pass

    def on_train_end(self, *, system: Any, driver: Any) -> None:
        pass


class Observers(Observer):
    """Several observers as one: every callback goes to each, in the order given (None entries skipped)."""

    def __init__(self, *observers: RunObserver | None) -> None:
        self.observers: tuple[RunObserver, ...] = tuple(o for o in observers if o is not None)

    def on_train_start(self, *, system: Any, driver: Any) -> None:
        for o in self.observers:
            o.on_train_start(system=system, driver=driver)

    def on_batch(self, *, batch: TrainBatch) -> None:
        for o in self.observers:
            o.on_batch(batch=batch)

    def on_step(self, *, record: dict[str, Any]) -> None:
        for o in self.observers:
            o.on_step(record=record)

    def on_eval(self, *, record: dict[str, Any]) -> None:
        for o in self.observers:
            o.on_eval(record=record)

    def on_candidates(self, *, step: int, rows: list[dict[str, Any]]) -> None:
        for o in self.observers:
            o.on_candidates(step=step, rows=rows)

    def on_train_end(self, *, system: Any, driver: Any) -> None:
        for o in self.observers:
            o.on_train_end(system=system, driver=driver)
