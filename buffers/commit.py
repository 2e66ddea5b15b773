"""The order of a replay shard's calls when it serves several at once (group commit).

A shard actor runs with `replay.concurrent_calls` threads, so pushes from several samplers are in the shard at
the same time and share one fdatasync of the write-ahead log (`WriteAheadLog.sync`) instead of queueing one
fsync each behind the other. What stays as with one call at a time:

- A state-changing call (push, take, set_collect) is checked and its frame written under the shard's lock, so
  frames are in the log in the order the calls are numbered here (`begin`); it is applied only after its
  frame is durable, and in that same order (`finish` waits for its turn), so the state after a restart (the
  snapshot plus the log, replayed in order) is the state the calls made. Nothing is answered before it is
  durable: a call's result is computed when it is applied.
- A call whose sync failed is neither applied nor answered (it raises): with nothing applied out of order, the
  shard's memory is the durable log, and the client's retry lands after.
- Reads (`sample`, `stats`, ...) take the lock and see the calls applied so far.
- A snapshot or compaction (`exclusive`) waits until every call in flight is applied and lets no new one in
  meanwhile: a self-snapshot never misses a frame of the log it replaces.

`locked` and `alone` mark the shard's methods that run under its lock or with the shard alone; the shard
keeps its `CallOrder` as `order`.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from buffers.wal import Ticket, WriteAheadLog

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])


class CallOrder:
    """Numbers a shard's state-changing calls, applies them in that order once their frames are durable."""

    def __init__(self) -> None:
        self.lock = threading.Condition(threading.RLock())  # the shard's state; `with order.lock:`
        self._next = 0  # the number the next state-changing call gets
        self._turn = 0  # the number of the next call to apply
        self._exclusive = False  # a snapshot is waiting for (or holds) the shard alone

    def begin(self, write: Callable[[], Ticket | None]) -> tuple[int, Ticket | None]:
        """Under `lock`: wait while a snapshot runs, `write()` the call's frame (if it raises, the call is not
        numbered) and return the call's number with the frame's ticket."""
        while self._exclusive:
            self.lock.wait()
        ticket = write()
        self._next += 1
        return self._next - 1, ticket

    def finish(self, seq: int, ticket: Ticket | None, wal: WriteAheadLog | None, apply: Callable[[], T]) -> T:
        """Outside `lock`: wait until call `seq`'s frame (`ticket`, None if it logs nothing) is durable, then
        apply it in its turn and return its result; raise, unapplied, if its sync failed."""
        error: OSError | None = None
        if ticket is not None and wal is not None:
            try:
                wal.sync(ticket)
            except OSError as err:
                error = err
        with self.lock:
            while self._turn != seq:
                self.lock.wait()
            try:
                if error is not None:
                    raise error
                return apply()
            finally:
                self._turn += 1
                self.lock.notify_all()

    def idle(self) -> bool:
        """Every call numbered so far is applied (under `lock`)."""
        return self._turn == self._next

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        """The shard alone: once every call in flight is applied, and with no new one let in until the end."""
        with self.lock:
            while self._exclusive:
                self.lock.wait()
            self._exclusive = True
            try:
                while self._turn != self._next:
                    self.lock.wait()
                yield
            finally:
                self._exclusive = False
                self.lock.notify_all()


def locked(method: F) -> F:
    """Run under the lock of `self.order` (a `CallOrder`): the shard's state is shared by the threads that
    serve concurrent calls."""

    @functools.wraps(method)
    def run(self: Any, *args: Any, **kwargs: Any) -> Any:
        with self.order.lock:
            return method(self, *args, **kwargs)

    return run  # type: ignore[return-value]


def alone(method: F) -> F:
    """Run with the shard alone (`self.order.exclusive()`): snapshots, compaction, restore."""

    @functools.wraps(method)
    def run(self: Any, *args: Any, **kwargs: Any) -> Any:
        with self.order.exclusive():
            return method(self, *args, **kwargs)

    return run  # type: ignore[return-value]
