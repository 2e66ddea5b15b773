"""``exgrpo.core.cores``: samplers in other processes lend their core while idle, a learner's threads follow, a dead
sampler lends nothing and its slot is taken again; ``EngineGate`` marks its calls."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from actors.engine_gate import EngineGate
from exgrpo.core import cores
from exgrpo.core.cores import Borrower, Lender, job_ledger, ledger_path

CHILD = textwrap.dedent("""
    import sys
    from pathlib import Path
    from exgrpo.core.cores import Lender
    lender = Lender(Path(sys.argv[1]), cores=int(sys.argv[2]))
    print("ready", flush=True)
    for line in sys.stdin:
        if line.strip() == "exit":
            lender.close()
            break
        lender.mark(line.strip() == "busy")
        print("ok", flush=True)
""")


class Child:
    """A sampler stand-in in its own process: registers a ``Lender`` (busy), then marks what it is told."""

    def __init__(self, path: Path, cores: int = 1) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(path), str(cores)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None and self.proc.stdout.readline().strip() == "ready"

    def say(self, what: str) -> None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(what + "\n")
        self.proc.stdin.flush()
        if what != "exit":
            assert self.proc.stdout.readline().strip() == "ok"

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)


@pytest.fixture
def ledger(tmp_path) -> Path:
    return ledger_path("02000000-abc", root=tmp_path)


def test_threads_follow_the_idle_samplers_within_the_limit(ledger):
    calls: list[int] = []
    borrower = Borrower(ledger, own=1, set_threads=calls.append, limit=2, free=lambda: math.inf)
    assert calls == [1] and borrower.lendable() == 0
    a, b = Child(ledger), Child(ledger)
    try:
        assert borrower.resize() == 1  # registered busy: nothing lent before the engine is up
        a.say("idle")
        assert borrower.lendable() == 1 and borrower.resize() == 2
        b.say("idle")
        assert borrower.lendable() == 2 and borrower.resize() == 2  # at most the limit
        a.say("busy")
        b.say("busy")
        assert borrower.resize() == 1
        assert calls == [1, 2, 1]  # set only when the count changes
        b.say("exit")  # a closed slot lends nothing
        b.proc.wait(timeout=10)
        a.say("idle")
        assert borrower.lendable() == 1
    finally:
        for c in (a, b):
            if c.proc.poll() is None:
                c.kill()


def test_a_killed_sampler_lends_nothing_and_its_slot_is_reused(ledger):
    borrower = Borrower(ledger, own=2, set_threads=lambda n: None, limit=8, free=lambda: math.inf)
    dead = Child(ledger, cores=3)
    dead.say("idle")
    assert borrower.lendable() == 3 and borrower.resize() == 5
    dead.kill()  # SIGKILL: no close
    assert borrower.lendable() == 0 and borrower.resize() == 2
    again = Child(ledger)
    try:
        pids = {cores._Ledger(ledger).read(slot)[0] for slot in range(cores.SLOTS)}
        assert dead.proc.pid not in pids and again.proc.pid in pids  # the dead one's slot, taken again
    finally:
        again.kill()


def test_a_lent_core_that_something_else_uses_is_not_taken(ledger):
    free = [math.inf]
    borrower = Borrower(ledger, own=1, set_threads=lambda n: None, limit=4, free=lambda: free[0])
    lender = Child(ledger)
    try:
        lender.say("idle")
        assert borrower.resize() == 2
        free[0] = (
            0.4  # the machine had under a core free in the last interval: the idle sampler's core is taken
        )
        assert borrower.resize() == 1
    finally:
        lender.kill()
    real = Borrower(ledger, own=1, set_threads=lambda n: None, limit=4)  # the machine's own measure
    assert real.free() >= 0.0  # the constructor's resize took the first reading


def test_this_process_never_lends_to_itself(ledger):
    lender = Lender(ledger, cores=1)
    lender.mark(False)
    assert Borrower(ledger, own=1, set_threads=lambda n: None, limit=4).lendable() == 0


def test_the_gate_marks_engine_and_control_calls():
    marks: list[bool] = []
    gate = EngineGate("sampler-0", end_session=lambda: None, on_busy=marks.append)
    with gate.engine():
        assert marks == [True]
    with gate.control("join_world", time.time() + 5):
        pass
    assert marks == [True, False, True, False]


def test_no_ledger_outside_a_ray_worker():
    assert job_ledger(None, None) is None and job_ledger("01000000", "") is None
    assert job_ledger("01000000", "ab" * 20) == ledger_path("01000000-" + "ab" * 8)
    assert ledger_path("01/../x").name == "exgrpo-cores-01____x"  # no path separator survives
    assert cores.node_cores() == len(os.sched_getaffinity(0))
