"""Verification worker processes: a pool that runs math-verify jobs in parallel, each under a hard deadline.

What is verified is `exgrpo.verify.verifier`'s and `exgrpo.verify.answers`'s; this module holds the processes
(`exgrpo.verify.worker_handle.Worker`), the scheduling (one dispatcher thread, round robin over callers' batches)
and the deadlines. Invariants: a job past `timeout_s` scores 0 and its worker is killed and replaced, a spare
standing by, so a job waits at most as long as the one ahead of it runs; the parent never parses model text
(no pickle, no eval); a user's reward's failures are counted by kind. More: docs/rewards.md ("Deadlines,
parallel callers, safety"); tests: tests/exgrpo/verify/test_rewards.py.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
import threading
import time
import weakref
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import wait

from exgrpo.verify.worker import ERROR, RAISED, READY, TIMED_OUT
from exgrpo.verify.worker_handle import Job, Worker

logger = logging.getLogger(__name__)

__all__ = ["Job", "Pool"]

_STARTUP_TIMEOUT_S = 120.0  # a worker imports sympy and math-verify (~1 s idle, more under load)


@dataclass(eq=False)
class _Batch:
    """One caller's jobs: undispatched indices, verdicts, and how many are still out."""

    jobs: Sequence[Job]
    timeout_s: float
    pending: deque[int] = field(default_factory=deque)
    verdicts: list[float] = field(default_factory=list)
    left: int = 0
    done: threading.Event = field(default_factory=threading.Event)
    error: str | None = None

    def __post_init__(self) -> None:
        self.pending.extend(range(len(self.jobs)))
        self.verdicts = [0.0] * len(self.jobs)
        self.left = len(self.jobs)

    def finish(self, index: int, value: float) -> None:
        self.verdicts[index] = value
        self.left -= 1
        if self.left <= 0:
            self.done.set()


_POOLS: weakref.WeakSet[Pool] = weakref.WeakSet()


class Pool:
    """`size` busy workers at most, plus `spares` loaded standby ones, driven by one dispatcher
    thread (all started on first use).

    Batches from any thread queue up; the dispatcher gives each idle worker the next job of the
    next batch in turn while fewer than `size` jobs run, kills a job at its deadline and replaces a
    dead worker at once. The spare makes a kill cost no start-up: the job waiting behind a killed
    one goes to the standby worker at once while the successor loads (~1 s idle, several under load).
    """

    def __init__(
        self,
        *,
        size: int,
        max_memory_mb: int | None,
        spares: int = 1,
        reward_fn: str | None = None,
        import_root: str | None = None,
    ) -> None:
        self._size = size
        self._spares = spares
        self._max_memory_mb = max_memory_mb
        self._reward_fn, self._import_root = reward_fn, import_root  # a user's reward instead of math-verify
        self._closed = False
        self.timeouts = 0
        self.errors = 0  # reward-function jobs that raised, returned no finite number, or crashed the worker
        self.failures: dict[str, int] = {}  # kind ("raised", "not a number", "timed out") -> jobs scored 0
        self.first_failures: dict[str, str] = {}  # kind -> what the first one said, with its row's qid
        self._reset()
        _POOLS.add(self)

    def _reset(self) -> None:
        """Fresh state (at construction, and in a forked child: the workers are the parent's)."""
        self._workers: list[Worker] = []
        self._lock = threading.Lock()
        self._queue: deque[_Batch] = deque()  # batches with undispatched jobs, served in turn
        self._busy: dict[Worker, tuple[_Batch, int, float]] = {}  # worker -> (batch, job, deadline)
        self._thread: threading.Thread | None = None
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        self._start_error: str | None = None

    def run(self, jobs: Sequence[Job], *, timeout_s: float) -> list[float]:
        """Value per job (1.0 / 0.0 for math jobs, the function's float for reward jobs); a job with no
        reply timeout_s after its dispatch, or whose worker died or errored, is 0.0."""
        if not jobs:
            return []
        batch = _Batch(jobs, timeout_s)
        with self._lock:
            self._prepare()
            self._queue.append(batch)
        self._wake()
        try:
            batch.done.wait()
        finally:
            if not batch.done.is_set():  # interrupted: dispatch no more of it
                with self._lock:
                    batch.pending.clear()
        if batch.error is not None:
            raise RuntimeError(batch.error)
        return batch.verdicts

    def start(self) -> None:
        """Start the workers now and wait until every one is ready."""
        with self._lock:
            self._prepare()
        self._wake()
        while True:
            with self._lock:
                if self._closed:
                    raise RuntimeError("this Verifier is closed")
                if self._start_error is not None:
                    raise RuntimeError(self._start_error)
                if all(w.ready for w in self._workers):
                    return
            time.sleep(0.02)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._fail_all("this Verifier was closed while scoring")
            for worker in self._workers:
                worker.kill()
            self._workers.clear()
        self._wake()

    def _prepare(self) -> None:
        """Top the workers up and make sure the dispatcher runs (lock held)."""
        if self._closed:
            raise RuntimeError("this Verifier is closed")
        self._start_error = None
        for dead in [w for w in self._workers if w.process.poll() is not None and w not in self._busy]:
            self._replace(dead)
        while len(self._workers) < self._size + self._spares:
            self._workers.append(self._new_worker())
        if self._thread is None:
            self._thread = threading.Thread(target=self._dispatch, name="exgrpo-verifier", daemon=True)
            self._thread.start()

    def _wake(self) -> None:
        with contextlib.suppress(BlockingIOError, OSError):
            os.write(self._wake_w, b"x")

    def _next_job(self) -> tuple[_Batch, int] | None:
        while self._queue:
            batch = self._queue.popleft()
            if batch.pending:
                index = batch.pending.popleft()
                if batch.pending:
                    self._queue.append(batch)  # round robin: the next batch goes next
                return batch, index
        return None

    def _dispatch(self) -> None:
        try:
            while True:
                with self._lock:
                    if self._closed:
                        return
                    self._assign()
                    starting = [w for w in self._workers if not w.ready]
                    watched = [*self._busy, *starting]
                    deadlines = [deadline for _, _, deadline in self._busy.values()]
                    deadlines += [w.started + _STARTUP_TIMEOUT_S for w in starting]
                timeout = max(0.0, min(deadlines) - time.monotonic()) if deadlines else None
                ready = wait([*watched, self._wake_r], timeout=timeout)
                with self._lock:
                    if self._closed:
                        return
                    if self._wake_r in ready:
                        os.read(self._wake_r, 4096)
                    self._handle([w for w in ready if isinstance(w, Worker)])
        except BaseException as error:  # a bug here must not leave callers waiting forever
            with self._lock:
                self._fail_all(f"the verifier's dispatcher failed: {error!r}")
                self._thread = None
            raise

    def _assign(self) -> None:
        for worker in [w for w in self._workers if w.ready and w not in self._busy]:
            if len(self._busy) >= self._size or (job := self._next_job()) is None:
                return
            batch, index = job
            if worker.send(batch.jobs[index], batch.timeout_s):
                self._busy[worker] = (batch, index, time.monotonic() + batch.timeout_s)
            else:  # died while idle: the job goes first to another worker
                batch.pending.appendleft(index)
                if batch not in self._queue:
                    self._queue.appendleft(batch)
                self._replace(worker)

    def _handle(self, ready: list[Worker]) -> None:
        """Replies, workers ready, deadlines passed (lock held)."""
        for worker in ready:
            if worker not in self._workers:
                continue
            reply = worker.recv()
            if worker in self._busy:
                batch, index, _ = self._busy.pop(worker)
                batch.finish(index, self._value(reply, batch.jobs[index]))
                if reply is None:  # crashed on this job (it scores 0)
                    self._replace(worker)
            elif reply == READY:
                worker.ready = True
            else:
                self._start_failed(
                    worker, f"{self._what} worker failed to start; see its traceback on stderr"
                )
        now = time.monotonic()
        for worker, (batch, index, deadline) in list(self._busy.items()):
            if deadline <= now and not wait([worker], timeout=0):
                del self._busy[worker]
                self.timeouts += 1  # counted before the caller can see the result
                self._failed(TIMED_OUT, f"no reply within {batch.timeout_s:g} s", batch.jobs[index])
                batch.finish(index, 0.0)
                self._replace(worker)
                logger.debug("a job passed its deadline; its worker was killed")
        for worker in [w for w in self._workers if not w.ready]:
            if worker.started + _STARTUP_TIMEOUT_S <= now:
                self._start_failed(
                    worker, f"{self._what} worker did not start within {_STARTUP_TIMEOUT_S:.0f} s"
                )

    @property
    def _what(self) -> str:
        return f"a reward.fn={self._reward_fn}" if self._reward_fn else "a math-verify"

    def _value(self, reply: bytes | None, job: Job) -> float:
        """A reply line as a score (lock held): math 1/0, a reward's float; errors and crashes count and score 0."""
        if reply in (b"1", b"0") and self._reward_fn is None:
            return float(reply == b"1")
        if reply is not None and reply.startswith(ERROR + b" "):
            try:
                kind, text = json.loads(reply[len(ERROR) + 1 :])  # two strings (the worker's failure_reply)
            except ValueError:
                kind, text = RAISED, "(unreadable failure reply)"
            if self._reward_fn is not None:
                self.errors += 1
                self._failed(str(kind), str(text), job)
            return 0.0
        try:
            return float(reply) if reply not in (None, ERROR) else self._no_value(reply, job)
        except ValueError:
            return self._no_value(reply, job)

    def _no_value(self, reply: bytes | None, job: Job) -> float:
        """A reply that is no number (lock held): a crashed worker or a bare error line; scores 0."""
        if self._reward_fn is not None:
            self.errors += 1
            self._failed(RAISED, _crash_text(reply), job)
        return 0.0

    def _failed(self, kind: str, text: str, job: Job) -> None:
        """Count a failure of `kind`; the first of each kind is kept and logged, with its row's qid (lock held)."""
        self.failures[kind] = self.failures.get(kind, 0) + 1
        if kind not in self.first_failures:
            qid = (job.fields or {}).get("qid")
            where = f" (qid {qid})" if qid is not None else ""
            self.first_failures[kind] = f"{text}{where}"
            who = f"reward.fn={self._reward_fn}" if self._reward_fn else "math-verify"
            # INFO: the run logs the first of each kind once as a warning (the driver); --verbose shows each pool's
            logger.info("%s %s%s: %s; scored 0 (first of its kind here)", who, kind, where, text)

    def _start_failed(self, worker: Worker, message: str) -> None:
        worker.kill()
        self._workers.remove(worker)  # not replaced: the next call tries again
        self._start_error = message
        if not any(w.ready for w in self._workers):
            self._fail_all(message)

    def _fail_all(self, message: str) -> None:
        batches = {*self._queue, *(batch for batch, _, _ in self._busy.values())}
        for worker in self._busy:
            worker.kill()
            if worker in self._workers:
                self._workers.remove(worker)
        self._busy.clear()
        self._queue.clear()
        for batch in batches:
            batch.error = message
            batch.pending.clear()
            batch.done.set()

    def _replace(self, worker: Worker) -> None:
        """Kill a worker and start its successor now, so it loads while others work."""
        worker.kill()
        if worker in self._workers:
            self._workers.remove(worker)
        if not self._closed:
            self._workers.append(self._new_worker())

    def _new_worker(self) -> Worker:
        return Worker(
            max_memory_mb=self._max_memory_mb, reward_fn=self._reward_fn, import_root=self._import_root
        )


def _crash_text(reply: bytes | None) -> str:
    return "the worker died on this row" if reply is None else "no verdict in its reply"


def _close_all() -> None:
    for pool in list(_POOLS):
        pool.close()


def _after_fork() -> None:
    for pool in list(_POOLS):
        pool._reset()


atexit.register(_close_all)
os.register_at_fork(after_in_child=_after_fork)
