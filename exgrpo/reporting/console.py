"""The terminal during a run: phase lines, the step bar, and quiet libraries.

- `Phase`: the names of a run's phases (the training recipe's stages; the report sums the fixed ones).
- `Phases`: one line on stderr for every start-up / shut-down phase that runs past a couple of
  seconds (building the base model, starting Ray, starting actors, ...), with its duration; all
  phase times go into the summary (`phases_s`, `fixed_overhead_s`).
- `Progress`: the tqdm bar over the steps (reward, solve ratio, replay size, held-out accuracy, and the
  step's reward failures with their share when there are any), an
  observer of the driver (`exgrpo.loop.observer.Observer`).
- `quiet_libraries`: transformers' and DeepSpeed's routine lines off unless `logging.verbose`.
"""

from __future__ import annotations

import sys
import threading
import time
from enum import Enum
from typing import IO, Any

from exgrpo.core import metric_names as M
from exgrpo.loop.observer import Observer

PREFIX = "[exgrpo]"


class Phase(str, Enum):
    """The phases of a run (`exgrpo.runtime.recipe.TrainingRecipe`), in order; the value is the name shown
    on the terminal and kept in `summary.json` (`phases_s`)."""

    BASE_MODEL = "base model"
    DATA = "data"
    RAY = "Ray start-up"
    ACTORS = "actor start-up"
    LOGGERS = "loggers"
    TRAIN_LOOP = "train loop"  # evaluations, steps, checkpoints, the final save
    SHUTDOWN = "shutdown"
    REPORT = "report"

    __str__ = str.__str__  # the name itself, in f-strings and as a `Phases.times` key


class Phases:
    """Named, timed phases; `start(name)` ends the previous one. A phase still running after
    `announce_after_s` gets a line on `stream` (`[exgrpo] building base model ...`) and, when it
    ends, its duration; `announce=False` phases (the step loop, which has its own bar) stay silent."""

    def __init__(
        self, *, enabled: bool = True, announce_after_s: float = 2.0, stream: IO[str] | None = None
    ) -> None:
        self.enabled = enabled
        self.announce_after_s = announce_after_s
        self.stream = stream
        self.times: dict[str, float] = {}  # phase name (a plain string) -> seconds
        self._current: tuple[str, float, threading.Timer | None, list[bool]] | None = None
        self._lock = threading.Lock()

    def _say(self, text: str) -> None:
        print(f"{PREFIX} {text}", file=self.stream or sys.stderr, flush=True)

    def start(self, name: str, detail: str = "", *, announce: bool = True) -> None:
        """End the current phase and start `name` (a `Phase` or any other name)."""
        self.end()
        name = str(name)
        said = [False]
        timer = None
        if self.enabled and announce:

            def announce_now() -> None:
                with self._lock:
                    if self._current is not None and self._current[3] is said:
                        said[0] = True
                        self._say(f"{name}{': ' + detail if detail else ''} ...")

            timer = threading.Timer(self.announce_after_s, announce_now)
            timer.daemon = True
            timer.start()
        self._current = (name, time.perf_counter(), timer, said)

    def end(self) -> None:
        with self._lock:
            current, self._current = self._current, None
        if current is None:
            return
        name, t0, timer, said = current
        if timer is not None:
            timer.cancel()
        dt = time.perf_counter() - t0
        self.times[name] = self.times.get(name, 0.0) + dt
        if said[0]:
            self._say(f"{name}: {dt:.1f} s")


def quiet_libraries(*, verbose: bool) -> None:
    """In this process: no transformers / HF hub progress bars ("Writing model shards", "Loading
    weights") and only errors from their loggers, unless `verbose`. Actors get the same through
    `exgrpo.runtime.env.QUIET_ENV`."""
    if verbose:
        return
    try:
        import transformers

        transformers.utils.logging.disable_progress_bar()
        transformers.utils.logging.set_verbosity_error()
    except ImportError:  # pragma: no cover - transformers is a core dependency
        pass
    try:
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()
    except ImportError:  # pragma: no cover
        pass


class Progress(Observer):
    """A tqdm bar showing reward, solve ratio, replay size and held-out accuracy (`on_step` moves it)."""

    def __init__(
        self, *, total: int, enabled: bool = True, evaluating: bool = False, eval_key: str = "eval"
    ) -> None:
        """`evaluating`: the loop starts with a held-out evaluation; the bar says so until the first step.
        `eval_key`: the held-out accuracy's name on the bar, saying how it was measured (`eval(T 1.0, n 4)`)."""
        self.eval_key = eval_key
        self._bar = None
        if enabled:
            from tqdm import tqdm

            self._bar = tqdm(total=total, desc="exgrpo", unit="step", dynamic_ncols=True)
            if evaluating:
                self._bar.set_postfix_str("held-out evaluation before the first step")

    def update(self, record: dict[str, Any]) -> None:
        if self._bar is None:
            return
        post = {
            "reward": f"{record.get(M.MEAN_REWARD, 0):.3f}",
            "solve": f"{record.get(M.SOLVE_RATIO, 0):.3f}",
            "buffer": record.get(M.REPLAY_SIZE, 0),
            "v": record.get(M.VERSION, 0),
        }
        if M.EVAL_ACCURACY in record:
            post[self.eval_key] = f"{record[M.EVAL_ACCURACY]:.3f}"
        if record.get(M.REWARD_FAILURES):  # rewards that raised, returned no number or timed out (scored 0)
            post["reward_fail"] = f"{record[M.REWARD_FAILURES]} ({record.get(M.REWARD_FAILURE_SHARE, 0):.0%})"
        self._bar.set_postfix(post, refresh=False)
        self._bar.update(1)

    def on_step(self, *, record: dict[str, Any]) -> None:
        self.update(record)

    def skip(self, n: int) -> None:
        """Steps already done before a resume."""
        if self._bar is not None:
            self._bar.update(n)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
