"""The watcher that stops a vLLM engine core outliving its sampler (`actors/reaper.py`), on plain processes."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import psutil

from actors.reaper import reap

SPAWNS_A_CHILD = "import subprocess, time; p = subprocess.Popen(['sleep', '120']); print(p.pid, flush=True); time.sleep(120)"


def _gone(pid: int, *, wait_s: float = 0.0) -> bool:
    deadline = time.monotonic() + wait_s
    while True:
        try:
            dead = psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            dead = True
        if dead or time.monotonic() >= deadline:
            return dead
        time.sleep(0.05)


def test_what_outlives_its_killed_parent_is_killed_and_a_reused_pid_is_not() -> None:
    parent = subprocess.Popen([sys.executable, "-c", SPAWNS_A_CHILD], stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    bystander = subprocess.Popen(["sleep", "120"])  # recorded with another start time: a "reused" pid
    me = (parent.pid, psutil.Process(parent.pid).create_time())
    recorded = [(child, psutil.Process(child).create_time()), (bystander.pid, 1.0)]
    killed: list[int] = []
    watcher = threading.Thread(target=lambda: killed.append(reap(me, recorded, poll_s=0.05)))
    watcher.start()
    watcher.join(0.3)
    assert watcher.is_alive() and not _gone(child)  # the parent lives: nothing is touched
    parent.kill()  # what Ray does to an actor (SIGKILL): the child is orphaned
    parent.wait()
    watcher.join(10)
    assert killed == [1] and _gone(child, wait_s=10)
    assert bystander.poll() is None  # not the process that was recorded
    bystander.kill()
    bystander.wait()
