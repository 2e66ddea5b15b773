"""Pushes to replay from an asyncio actor, one call at a time, coalesced.

A continuous sampler finishes its requests one by one, and pushing each group in its own call would pay
Ray's per-call cost (client and shard) once per group. `CoalescedPush` keeps at most one push in flight:
a group that finishes while a push is out waits for it and goes with every other group that finished
meanwhile, in the next call. A lone group is pushed at once (no timer, no added latency when idle); under
load the calls grow with the rate groups finish. Each caller returns once its own group is recorded (or
raises what that push raised), so a request is still reported only after its group is in replay.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

from exgrpo.core.records import Group


class CoalescedPush:
    def __init__(self, push: Callable[..., Any]) -> None:
        self._push = push  # blocking `Replay.push(groups=...)`; run in a thread, off the event loop
        self._waiting: list[tuple[Group, asyncio.Future[None]]] = []
        self._drain: asyncio.Task[None] | None = None
        self.calls = 0  # push calls made (for tests and benchmarks)

    async def push(self, group: Group) -> None:
        """Record `group` in replay; returns once the call that carried it succeeded."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.append((group, done))
        if self._drain is None or self._drain.done():  # its own task: a cancelled caller cannot stall it
            self._drain = asyncio.create_task(self._send_all())
        await done

    async def _send_all(self) -> None:
        while self._waiting:
            batch, self._waiting = self._waiting, []
            self.calls += 1
            try:
                await asyncio.to_thread(self._push, groups=[g for g, _ in batch])
            except Exception as err:  # each caller of this call sees the error (RayInvoke already retried)
                _settle(batch, err)
            else:
                _settle(batch, None)


def _settle(batch: Sequence[tuple[Group, asyncio.Future[None]]], err: Exception | None) -> None:
    for _, done in batch:
        if done.done():  # its caller was cancelled
            continue
        if err is None:
            done.set_result(None)
        else:
            done.set_exception(err)
