"""CoalescedPush: one push in flight, the groups that finish meanwhile go together in the next call."""

from __future__ import annotations

import asyncio
import threading

import pytest

from actors.coalesce import CoalescedPush
from exgrpo.core.records import Group


def _g(i: int) -> Group:
    return Group(qid=f"q{i}", prompt_ids=(1,), trajectories=(), request_id=i)


class GatedReplay:
    """A replay whose push blocks until the test opens the gate, recording each call's request ids."""

    def __init__(self, fail_on: int | None = None) -> None:
        self.calls: list[list[int]] = []
        self.gate = threading.Event()
        self.fail_on = fail_on

    def push(self, *, groups):
        self.calls.append([g.request_id for g in groups])
        assert self.gate.wait(timeout=10)
        if self.fail_on in self.calls[-1]:
            raise RuntimeError("shard lost")


async def _until(cond) -> None:
    for _ in range(1000):
        if cond():
            return
        await asyncio.sleep(0.005)
    raise AssertionError("timed out")


def test_groups_finishing_during_a_push_go_together_in_the_next_call():
    async def main():
        replay = GatedReplay()
        c = CoalescedPush(replay.push)
        first = asyncio.create_task(c.push(_g(1)))
        await _until(lambda: replay.calls == [[1]])  # a lone group goes at once
        rest = [asyncio.create_task(c.push(_g(i))) for i in (2, 3, 4)]
        await asyncio.sleep(0.05)
        assert replay.calls == [[1]] and not first.done()  # one call in flight, the others wait
        replay.gate.set()
        await asyncio.gather(first, *rest)
        assert replay.calls == [[1], [2, 3, 4]] and c.calls == 2
        await c.push(_g(5))  # idle again: at once, alone
        assert replay.calls[-1] == [5]

    asyncio.run(main())


def test_a_failed_push_fails_exactly_its_callers_and_the_next_call_still_goes():
    async def main():
        replay = GatedReplay(fail_on=2)
        c = CoalescedPush(replay.push)
        first = asyncio.create_task(c.push(_g(1)))
        await _until(lambda: len(replay.calls) == 1)
        second = [asyncio.create_task(c.push(_g(i))) for i in (2, 3)]
        await asyncio.sleep(0.02)
        replay.gate.set()
        await first
        for t in second:
            with pytest.raises(RuntimeError, match="shard lost"):
                await t
        await c.push(_g(4))
        assert replay.calls == [[1], [2, 3], [4]]

    asyncio.run(main())


def test_a_cancelled_caller_does_not_stall_the_others():
    async def main():
        replay = GatedReplay()
        c = CoalescedPush(replay.push)
        first = asyncio.create_task(c.push(_g(1)))
        await _until(lambda: len(replay.calls) == 1)
        first.cancel()  # the caller goes; its push is still out and the queue keeps draining
        later = asyncio.create_task(c.push(_g(2)))
        await asyncio.sleep(0.02)
        replay.gate.set()
        await later
        assert replay.calls == [[1], [2]]

    asyncio.run(main())
