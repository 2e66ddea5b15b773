"""The parent's side of one verification worker process, and the job it is sent.

A worker is `python -c "from exgrpo.verify.worker import worker_main; ..."`, so nothing depends on how
the host process was started; it reads one JSON line per job on stdin, `[kind, payloads, gold,
timeout_s, fields]`, and writes one reply line on stdout (`exgrpo/verify/worker.py`). `Worker` starts
it (with the reward function and memory cap in its environment), sends a `Job`, reads a reply and
SIGKILLs and reaps it; the scheduling and the deadlines are `exgrpo.verify.pool`'s.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any, Literal

from exgrpo.verify.worker import REWARD_FN_ENV


@dataclass(frozen=True)
class Job:
    """One verification: "values": every payload must verify against gold; "text": math-verify's
    extraction finds the stated answer in payloads[0] (a response tail with no box); "reward": a user's
    reward function scores payloads = [prompt, completion] with the row's `fields`."""

    kind: Literal["values", "text", "reward"]
    payloads: list[str]
    gold: str
    fields: dict[str, Any] | None = None


class Worker:
    """One verification process (started at construction; `ready` once math-verify is loaded)."""

    def __init__(self, *, max_memory_mb: int | None, reward_fn: str | None, import_root: str | None) -> None:
        package_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env = dict(os.environ, EXGRPO_VERIFY_MAX_MEMORY_MB=str(max_memory_mb or 0))
        env.pop(REWARD_FN_ENV, None)
        if reward_fn is not None:
            env[REWARD_FN_ENV] = reward_fn
        paths = (package_root, import_root, env.get("PYTHONPATH"))
        env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
        self.process = subprocess.Popen(
            [sys.executable, "-c", "from exgrpo.verify.worker import worker_main; worker_main()"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
        )
        self.ready = False
        self.started = time.monotonic()

    def fileno(self) -> int:  # lets multiprocessing.connection.wait select on the reply pipe
        return self.process.stdout.fileno()

    def send(self, job: Job, timeout_s: float) -> bool:
        """Hand the worker a job; False if it is dead."""
        try:
            self.process.stdin.write(
                json.dumps([job.kind, job.payloads, job.gold, timeout_s, job.fields]).encode() + b"\n"
            )
            self.process.stdin.flush()
        except (OSError, ValueError):
            return False
        return True

    def recv(self) -> bytes | None:
        """The worker's next reply line (without newline), or None if it died."""
        try:
            line = self.process.stdout.readline()
        except (OSError, ValueError):
            return None
        return line.rstrip(b"\n") if line.endswith(b"\n") else None

    def kill(self) -> None:
        """SIGKILL the process and reap it (no zombie)."""
        with contextlib.suppress(OSError):
            self.process.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=10)
        for pipe in (self.process.stdin, self.process.stdout):
            with contextlib.suppress(OSError):
                pipe.close()
