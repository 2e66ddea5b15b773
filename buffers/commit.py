"""The order of a replay shard's calls when it serves several at once (group commit).

Concurrent calls share one fdatasync of the write-ahead log, and what holds with one call at a time still holds:
state-changing calls are logged in the order `begin` numbers them and applied only once durable, in that order
(`finish`), so the snapshot plus the replayed log is the state the calls made; a call whose sync failed is neither
applied nor answered; reads see the calls applied so far; a snapshot or compaction (`exclusive`) runs with no call
in flight. More: docs/failures.md ("Replay shard death", "I/O faults in the log"); tests: tests/buffers/test_group_commit.py.
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
