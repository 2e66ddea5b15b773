"""`EngineGate`: who may use a sampler's engine, and when (plain threads; no Ray, no engine).

Engine calls (generate, evaluate, a weight load) and vLLM's weight-transfer control calls share one engine. One
call uses it at a time, a waiting control call first; a control call that gets its turn after its deadline, or
belongs to an abandoned session, is refused (`LateWeightUpdate`); engine calls wait while a session is open or the
engine is reserved for a weight world being opened (`reserve`), and an abandoned session is ended first; after a failed weight write serving calls are refused (`WeightsFailed`) until a
write succeeds. Tests: tests/actors/test_engine_gate.py, tests/actors/test_transfer_hangs.py.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from collections.abc import Callable, Iterator


class WeightsFailed(RuntimeError):
    """A generate or evaluate call refused because the sampler's last weight load or update failed."""


class LateWeightUpdate(RuntimeError):
    """A weight-transfer control call that reached the sampler after its caller's deadline (refused, not run)."""


class EngineGate:
    """The engine's turns, the open update session and whether the served weights are whole."""

    def __init__(
        self, name: str, *, end_session: Callable[[], None], on_busy: Callable[[bool], object] | None = None
    ) -> None:
        """`on_busy`: told True when a call takes the engine and False when it leaves it (a core's lending)."""
        self.name = name
        self._end_session = end_session  # finishes an open update on the engine, keeping the served version
        self._cv = threading.Condition()
        self._busy = False  # a call holds the engine
        self._control_waiting = 0  # control calls waiting for the engine (they go first)
        self.session_open = False  # an update started and not finished (vLLM's layers may be on meta)
        self.session_loaded = False  # the open session has received weights (ending it early leaves a mix)
        self.session_deadline = math.inf
        # a weight world is being opened (`reserve`): engine calls wait until then, so the world's rendezvous
        # (vLLM's store waits 300 s for every member) never waits behind a generate call
        self.reserved_until = 0.0
        self.weights_failed: str | None = None  # why the last weight write failed (None: it did not)
        self.running: tuple[str, float] | None = None  # the control call holding the engine, and its deadline
        self.aborted = self.refused = 0
        self.on_busy = on_busy

    @contextlib.contextmanager
    def control(self, what: str, deadline: float | None, *, session: bool = False) -> Iterator[None]:
        """The engine for a control call: after the engine call in flight, refused past `deadline` (and, for a
        `session` call, refused when no session is open)."""
        with self._cv:
            self._control_waiting += 1  # the next turn is ours, not the next queued engine call's
            try:
                while self._busy:
                    left = None if deadline is None else deadline - time.time()
                    if left is not None and left <= 0:
                        break
                    self._cv.wait(timeout=left)
            finally:
                self._control_waiting -= 1
                self._cv.notify_all()  # an engine call waiting for our turn re-checks (we may be refused)
            try:
                if deadline is not None and time.time() > deadline:
                    raise LateWeightUpdate(
                        f"{self.name}: {what} arrived {time.time() - deadline:.1f} s after its deadline; "
                        "refused (the learner has given up on this update)"
                    )
                if session and not self.session_open:
                    raise LateWeightUpdate(
                        f"{self.name}: {what} for a weight update that was abandoned; refused"
                    )
            except LateWeightUpdate:
                self.refused += 1
                raise
            self._take()
            self.running = (what, math.inf if deadline is None else deadline)
        try:
            yield
        finally:
            self.running = None
            self._release()

    @contextlib.contextmanager
    def engine(self, *, wait_session: bool = True, serving: bool = True) -> Iterator[None]:
        """The engine for an engine call: after any control call, any open session and any reservation (each
        until its deadline; an abandoned session is ended here). `wait_session=False` (the fallback load, sent once the learner gave up
        on the session) ends an open session and a reservation at once. A `serving` call is refused while `weights_failed`."""
        with self._cv:
            while self._busy or self._control_waiting or (wait_session and self._held()):
                until = max(self.reserved_until, self.session_deadline if self.session_open else 0.0)
                timed = wait_session and self._held() and not math.isinf(until)
                wait = max(until - time.time(), 0.0) + 0.01 if timed else None
                self._cv.wait(timeout=None if self._busy else wait)
            self._take()
            if not wait_session:
                self.reserved_until = 0.0
        try:
            self.close_session()
            if serving and self.weights_failed is not None:
                raise WeightsFailed(
                    f"{self.name} serves no request: its last weight update failed ({self.weights_failed}); "
                    "its engine may hold a mix of versions"
                )
            yield
        finally:
            self._release()

    def overdue(self) -> tuple[str, float] | None:
        """The control call holding the engine and how many seconds it is past its deadline (negative: in
        time); None when none is running. Read without the lock: a probe must answer while a call hangs."""
        running = self.running
        return None if running is None else (running[0], time.time() - running[1])

    def _held(self) -> bool:
        """An open session or a reservation, each until its deadline, keeps engine calls waiting."""
        now = time.time()
        return (self.session_open and now < self.session_deadline) or now < self.reserved_until

    def reserve(self, deadline: float | None) -> None:
        """Hold the engine for control calls only until `deadline` (None: until `unreserve`): the engine is
        free now and no engine call starts before the weight world is open and its update started."""
        with self._cv:
            self.reserved_until = math.inf if deadline is None else deadline

    def unreserve(self) -> None:
        with self._cv:
            self.reserved_until = 0.0
            self._cv.notify_all()

    def _take(self) -> None:
        self._busy = True
        if self.on_busy is not None:
            self.on_busy(True)

    def _release(self) -> None:
        with self._cv:
            self._busy = False
            if self.on_busy is not None:
                self.on_busy(False)
            self._cv.notify_all()

    def open_session(self, deadline: float | None) -> None:
        """An update started: it holds the engine until finished (or its deadline), in place of a reservation."""
        self.session_open, self.session_loaded = True, False
        self.session_deadline = math.inf if deadline is None else deadline
        self.reserved_until = 0.0

    def close_session(self) -> None:
        """End a session that was started and never finished (the engine keeps its served version's tag)."""
        if self.session_open:
            self.session_open = False
            self.aborted += 1
            with self.at_stake("an abandoned weight update"):
                self._end_session()
            if self.session_loaded:  # some layers took the new weights, the others kept theirs
                self.weights_failed = "a weight update was abandoned after some weights had arrived"

    def session_loading(self) -> None:
        """The open session receives weights: ended before it finishes, the engine holds a mix of versions."""
        self.session_loaded = True

    def finish_session(self) -> None:
        """The open session's update finished (or raised finishing, `at_stake` says which): it holds nothing."""
        self.session_open = False

    def session_failed(self, err: BaseException) -> None:
        """An update call raised inside the session: the session is over and the weights are a mix."""
        self.session_open = False
        self.aborted += 1
        self.weights_failed = f"update_weights failed: {type(err).__name__}: {err}"

    @contextlib.contextmanager
    def at_stake(self, what: str) -> Iterator[None]:
        """A call that writes the served weights: if it raises they may be a mix (`weights_failed` is set and
        serving calls are refused); if it returns they are whole again."""
        try:
            yield
        except BaseException as e:
            self.weights_failed = f"{what} failed: {type(e).__name__}: {e}"
            raise
        self.weights_failed = None
