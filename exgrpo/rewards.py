"""Rewards: final-answer extraction and math verification with a hard wall-clock timeout.

reward = 1.0 if the final answer extracted from the response is equivalent to the gold answer,
else 0.0. Equivalence is math-verify's: both sides are parsed from LaTeX into sympy and compared
numerically (floats to 6 decimals), symbolically (simplify(a - b) == 0), as sets, intervals or
relations. Gold goes first (verify is not symmetric; e.g. the answer `x = 3` matches the gold 3).

The box format is spelt once, here: `BOX_COMMAND` and `boxed(answer)` write it, `last_boxed(text)`
reads it, for every caller (task solutions, dataset cleaning, gold answers, responses). Extraction is
one linear scan with a brace stack (no recursive regex): the content of the last `\\boxed{...}` to
close (nested braces matched; `\\{`, `\\}` are brace escapes that neither open nor close) or the
token of a brace-less `\\boxed 5`. "think" mode searches only the text after the first `</think>`,
which a `<think>` must precede.

Verification runs in worker processes (`python -c`, so nothing depends on how the host process
was started), and the deadline holds in any thread, unlike math-verify's SIGALRM timeouts: the
parent waits on the reply pipe with a timeout, SIGKILLs and reaps a worker that overruns (that
item scores 0) and starts its successor at once. An orphaned worker exits at EOF on its stdin, or
by RLIMIT_CPU (timeout + 2 s of CPU per job) if the parent died mid-job.

Safety: the parent never parses model text; it writes JSON strings to a worker and reads back
`1` or `0` (no pickle). In the worker math-verify parses LaTeX with its ANTLR grammar; its
plain-expression fallback sees only digit/operator strings matched by its own regex.

Fast paths never turn a wrong answer right: identical strings score 1, two integers are compared
digit by digit, and answers longer than `max_answer_chars` score 0, all without a worker.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from multiprocessing.connection import wait
from typing import get_args

from exgrpo.config import RewardMode

logger = logging.getLogger(__name__)

BOX_COMMAND = "\\boxed"  # the box the final answer goes in: `\\boxed{42}`
BOX_OPEN = BOX_COMMAND + "{"

_TOKEN = re.compile(re.escape(BOX_COMMAND) + r"(?![A-Za-z])|\\.|[{}]", re.DOTALL)  # box command, escape, brace
_SPACES = re.compile(r"\s*")
_BARE_ARG = re.compile(r"[ \t]+([^\s${}]*[^\s${}.,;:])")  # `\boxed 5` (a sentence's final `.` is not in it)
_INTEGER = re.compile(r"([+-]?)0*(\d+)", re.ASCII)
_READY = b"ready"
_STARTUP_TIMEOUT_S = 120.0  # a worker imports sympy and math-verify (~1 s idle, more under load)


# ----------------------------------------------------------------------------------- extraction


def boxed(answer: str | int) -> str:
    """`answer` written in the box format: `boxed(413) == "\\\\boxed{413}"` (what `last_boxed` reads)."""
    return f"{BOX_OPEN}{answer}}}"


def extract_answer(response: str, *, mode: RewardMode = "boxed") -> str | None:
    """The final answer of `response` (stripped), or None when there is none.

    "boxed": `last_boxed(response)`, the content of the last `\\boxed{...}` to close (nested braces
    matched; an unclosed box at the end is ignored, so an earlier complete one wins) or of `\\boxed 5`.
    "think": the same, searched only after the first `</think>`, which a `<think>` must precede.
    Linear time in len(response).
    """
    if mode == "think":
        close = response.find("</think>")
        if close < 0 or response.find("<think>", 0, close) < 0:
            return None
        response = response[close + len("</think>") :]
    elif mode != "boxed":
        raise ValueError(f"mode must be 'boxed' or 'think', got {mode!r}")
    return last_boxed(response)


def last_boxed(text: str) -> str | None:
    """Content (stripped) of the last `\\boxed{...}` in `text` to close, or of a brace-less `\\boxed 5`.

    Braces nest; `\\{` and `\\}` are escapes (literal braces) that neither open nor close, so
    `\\boxed{x\\}y}` gives `x\\}y`; `\\boxed 5.` gives `5` (the run of characters after the
    spaces up to a space, `$` or brace, less trailing `.,;:`). A box that never closes is ignored
    (an earlier complete one wins). None when no box closes or the last one is empty. Linear time
    in len(text).
    """
    span: tuple[int, int] | None = None  # (start, end) of the last box content closed so far
    opens: list[int] = []  # per open brace: start of the box content it opens, or -1
    box_brace = -1  # position of the `{` that follows the latest `\boxed`
    for m in _TOKEN.finditer(text):
        token = m.group()
        if token == "{":
            opens.append(m.end() if m.start() == box_brace else -1)
        elif token == "}":
            if opens and (start := opens.pop()) >= 0:
                span = (start, m.start())
        elif token == BOX_COMMAND:
            after = _SPACES.match(text, m.end()).end()
            if after < len(text) and text[after] == "{":
                box_brace = after
            elif bare := _BARE_ARG.match(text, m.end()):
                span = bare.span(1)
    if span is None:
        return None
    return text[span[0] : span[1]].strip() or None


def _clean_gold(gold: str) -> str:
    """Strip whitespace and enclosing `$...$`; a gold written as `\\boxed{...}` is unboxed."""
    gold = gold.strip()
    while len(gold) >= 2 and gold[0] == "$" and gold[-1] == "$":
        gold = gold[1:-1].strip()
    if BOX_COMMAND in gold:
        gold = last_boxed(gold) or gold
    return gold


def _fast_verdict(answer: str, gold: str) -> bool | None:
    """True/False when decidable without parsing (identical strings, two integers), else None."""
    if answer == gold:
        return True
    a, g = _INTEGER.fullmatch(answer), _INTEGER.fullmatch(gold)
    if a is None or g is None:
        return None
    a_sign = a.group(1) == "-" and a.group(2) != "0"
    g_sign = g.group(1) == "-" and g.group(2) != "0"
    return a_sign == g_sign and a.group(2) == g.group(2)


# --------------------------------------------------------------------------------------- worker


def _worker_main() -> None:
    """Worker loop (run as `python -c`): read JSON [answer, gold, timeout_s] lines on stdin,
    write b"1" or b"0" lines: whether math-verify finds answer and gold equivalent."""
    import resource

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's business
    replies = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # stray prints from libraries go to stderr, not into the reply pipe
    memory_mb = int(os.environ.get("EXGRPO_VERIFY_MAX_MEMORY_MB", "0"))
    if memory_mb > 0:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_AS, (memory_mb * 2**20, memory_mb * 2**20))
    # math-verify warns that its own (SIGALRM) timeouts are off; the parent owns the deadline.
    logging.getLogger("math_verify").setLevel(logging.CRITICAL)
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    configs = [LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig()]

    @lru_cache(maxsize=1024)  # the K rollouts of a question share one gold
    def parse_gold(gold: str) -> list:
        return parse(boxed(gold), extraction_config=configs, parsing_timeout=None)

    def equivalent(answer: str, gold: str) -> bool:
        answer_parsed = parse(boxed(answer), extraction_config=configs, parsing_timeout=None)
        gold_parsed = parse_gold(gold)
        return bool(
            gold_parsed and answer_parsed and verify(gold_parsed, answer_parsed, timeout_seconds=None)
        )

    equivalent("1", "1")  # warm-up (regex compilation) before the first deadline starts
    replies.write(_READY + b"\n")
    replies.flush()
    _, cpu_hard = resource.getrlimit(resource.RLIMIT_CPU)
    for line in sys.stdin.buffer:  # ends when the parent closes the pipe or exits
        try:
            answer, gold, timeout_s = json.loads(line)
            # Backstop if the parent dies mid-job: the kernel kills a job past its CPU budget.
            used = sum(resource.getrusage(resource.RUSAGE_SELF)[:2])
            soft = int(used + timeout_s) + 2
            if cpu_hard == resource.RLIM_INFINITY or soft < cpu_hard:
                resource.setrlimit(resource.RLIMIT_CPU, (soft, cpu_hard))
            ok = equivalent(answer, gold)
        except Exception:  # unparsable or pathological text: not equivalent
            ok = False
        replies.write(b"1\n" if ok else b"0\n")
        replies.flush()


class _Worker:
    """One verification process (started at construction; `ready` once math-verify is loaded)."""

    def __init__(self, *, max_memory_mb: int | None) -> None:
        package_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env = dict(os.environ, EXGRPO_VERIFY_MAX_MEMORY_MB=str(max_memory_mb or 0))
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
        self.process = subprocess.Popen(
            [sys.executable, "-c", "from exgrpo.rewards import _worker_main; _worker_main()"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
        )
        self.ready = False
        self.started = time.monotonic()

    def fileno(self) -> int:  # lets multiprocessing.connection.wait select on the reply pipe
        return self.process.stdout.fileno()

    def send(self, answer: str, gold: str, timeout_s: float) -> bool:
        """Hand the worker a job; False if it is dead."""
        try:
            self.process.stdin.write(json.dumps([answer, gold, timeout_s]).encode() + b"\n")
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


def _kill_all(workers: list[_Worker]) -> None:
    for worker in workers:
        worker.kill()
    workers.clear()


class _Pool:
    """`size` worker processes, started on first use and replaced as soon as one is killed.

    One caller at a time: calls from several threads are serialised.
    """

    def __init__(self, *, size: int, max_memory_mb: int | None) -> None:
        self._size = size
        self._max_memory_mb = max_memory_mb
        self._workers: list[_Worker] = []
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._closed = False
        self.timeouts = 0
        self._finalizer = weakref.finalize(self, _kill_all, self._workers)  # also runs at exit

    def run(self, jobs: Sequence[tuple[str, str]], *, timeout_s: float) -> list[bool]:
        """Verdict per (answer, gold); a job with no reply timeout_s after dispatch is False."""
        verdicts = [False] * len(jobs)
        if not jobs:
            return verdicts
        with self._lock:
            self._top_up()
            pending = list(reversed(range(len(jobs))))  # pop() yields jobs in order
            busy: dict[_Worker, tuple[int, float]] = {}  # worker -> (job, deadline)
            try:
                while pending or busy:
                    for worker in [w for w in self._workers if w.ready and w not in busy]:
                        if not pending:
                            break
                        index = pending.pop()
                        if worker.send(*jobs[index], timeout_s):
                            busy[worker] = (index, time.monotonic() + timeout_s)
                        else:  # died while idle: retry the job on another worker
                            pending.append(index)
                            self._replace(worker)
                    self._wait(busy, verdicts, watch_startup=bool(pending))
            finally:  # on an exception, workers in the middle of a job cannot be reused
                for worker in busy:
                    self._replace(worker)
        return verdicts

    def start(self) -> None:
        """Start the workers now and wait until every one is ready."""
        with self._lock:
            self._top_up()
            while not all(w.ready for w in self._workers):
                self._wait({}, [], watch_startup=True)

    def _top_up(self) -> None:
        if self._closed:
            raise RuntimeError("this Verifier is closed")
        if os.getpid() != self._pid:  # forked: the workers belong to the parent process
            self._workers.clear()
            self._pid = os.getpid()
        for dead in [w for w in self._workers if w.process.poll() is not None]:
            self._replace(dead)
        while len(self._workers) < self._size:
            self._workers.append(_Worker(max_memory_mb=self._max_memory_mb))

    def _wait(
        self, busy: dict[_Worker, tuple[int, float]], verdicts: list[bool], *, watch_startup: bool
    ) -> None:
        """Wait for one event (reply, worker ready, deadline) and handle every one that happened."""
        starting = [w for w in self._workers if not w.ready] if watch_startup else []
        deadlines = [deadline for _, deadline in busy.values()]
        deadlines += [w.started + _STARTUP_TIMEOUT_S for w in starting]
        if not deadlines:
            raise RuntimeError("this Verifier was closed while scoring")
        for worker in wait([*busy, *starting], timeout=max(0.0, min(deadlines) - time.monotonic())):
            reply = worker.recv()
            if worker in busy:
                index, _ = busy.pop(worker)
                verdicts[index] = reply == b"1"
                if reply is None:  # crashed on this job (it scores 0)
                    self._replace(worker)
            elif reply == _READY:
                worker.ready = True
            else:
                self._replace(worker)
                raise RuntimeError("a math-verify worker failed to start; see its traceback on stderr")
        now = time.monotonic()
        for worker, (index, deadline) in list(busy.items()):
            if deadline <= now and not wait([worker], timeout=0):
                del busy[worker]
                self._replace(worker)
                self.timeouts += 1
                logger.debug("job %d passed its deadline; its worker was killed", index)
        for worker in starting:
            if not worker.ready and worker.started + _STARTUP_TIMEOUT_S <= now:
                raise RuntimeError(f"a math-verify worker did not start within {_STARTUP_TIMEOUT_S:.0f} s")

    def close(self) -> None:
        self._closed = True
        self._finalizer()

    def _replace(self, worker: _Worker) -> None:
        """Kill a worker and start its successor now, so it loads while others work."""
        worker.kill()
        if worker in self._workers:  # not if close() emptied the list meanwhile
            self._workers.remove(worker)
        if not self._closed:
            self._workers.append(_Worker(max_memory_mb=self._max_memory_mb))


# ------------------------------------------------------------------------------------- scoring


@dataclass(frozen=True)
class VerifierStats:
    """Counters since the Verifier was made (for `rollout/` metrics)."""

    scored: int  # responses scored
    fast: int  # decided without a worker: no answer, identical, two integers, or too long
    timeouts: int  # worker verifications killed at the deadline (each scored 0)


class Verifier:
    """Scores responses against gold answers; owns a pool of verification workers.

    timeout_s is a hard wall-clock limit per answer, counted from its dispatch to a worker.
    Answers longer than max_answer_chars score 0 unparsed (None: no limit). max_memory_mb caps
    each worker's address space (None: no cap). Calls from several threads are serialised.
    """

    def __init__(
        self,
        *,
        mode: RewardMode = "boxed",
        timeout_s: float = 5.0,
        workers: int = 1,
        max_answer_chars: int | None = 1000,
        fast_path: bool = True,
        max_memory_mb: int | None = 4096,
        _pool: _Pool | None = None,  # share another Verifier's workers (module-level functions)
    ) -> None:
        if mode not in get_args(RewardMode):
            raise ValueError(f"mode must be 'boxed' or 'think', got {mode!r}")
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        if max_answer_chars is not None and max_answer_chars < 1:
            raise ValueError(f"max_answer_chars must be >= 1 or None, got {max_answer_chars}")
        self.mode: RewardMode = mode
        self.timeout_s = timeout_s
        self.max_answer_chars = max_answer_chars
        self.fast_path = fast_path
        self._pool = _pool or _Pool(size=workers, max_memory_mb=max_memory_mb)
        self._count_lock = threading.Lock()
        self._scored = 0
        self._fast = 0

    def score(self, response: str, gold: str) -> float:
        """1.0 if the final answer of `response` is equivalent to `gold`, else 0.0; never raises
        because of the response."""
        return self.score_many([response], [gold])[0]

    def score_many(self, responses: Sequence[str], golds: Sequence[str]) -> list[float]:
        """score() for each pair, fanned out over the workers, one deadline per item."""
        if len(responses) != len(golds):
            raise ValueError(f"{len(responses)} responses but {len(golds)} golds; they must pair up")
        rewards = [0.0] * len(responses)
        jobs: list[tuple[str, str]] = []
        job_items: list[int] = []
        for i, (response, gold) in enumerate(zip(responses, golds, strict=True)):
            answer = extract_answer(response, mode=self.mode) if isinstance(response, str) else None
            if answer is None:
                continue
            gold = _clean_gold(gold)
            verdict = _fast_verdict(answer, gold) if self.fast_path else None
            if verdict is None and self.max_answer_chars is not None and len(answer) > self.max_answer_chars:
                verdict = False
            if verdict is None:
                jobs.append((answer, gold))
                job_items.append(i)
            else:
                rewards[i] = float(verdict)
        for i, ok in zip(job_items, self._pool.run(jobs, timeout_s=self.timeout_s), strict=True):
            rewards[i] = float(ok)
        with self._count_lock:
            self._scored += len(rewards)
            self._fast += len(rewards) - len(jobs)
        return rewards

    def start(self) -> None:
        """Start the workers and wait until they are ready (~1 s); else the first call does it."""
        self._pool.start()

    def stats(self) -> VerifierStats:
        return VerifierStats(scored=self._scored, fast=self._fast, timeouts=self._pool.timeouts)

    def close(self) -> None:
        """Kill and reap the workers; the Verifier cannot be used afterwards."""
        self._pool.close()

    def __enter__(self) -> Verifier:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


@lru_cache(maxsize=1)
def _shared_pool() -> _Pool:
    return _Pool(size=max(1, min(4, os.cpu_count() or 1)), max_memory_mb=4096)


@lru_cache(maxsize=16)
def _shared_verifier(mode: RewardMode, timeout_s: float) -> Verifier:
    return Verifier(mode=mode, timeout_s=timeout_s, _pool=_shared_pool())


def score(response: str, gold: str, *, mode: RewardMode = "boxed", timeout_s: float = 5.0) -> float:
    """Verifier.score on a module-wide pool of min(4, cpu_count) workers, started lazily."""
    return _shared_verifier(mode, timeout_s).score(response, gold)


def score_many(
    responses: Sequence[str], golds: Sequence[str], *, mode: RewardMode = "boxed", timeout_s: float = 5.0
) -> list[float]:
    """Verifier.score_many on a module-wide pool of min(4, cpu_count) workers, started lazily."""
    return _shared_verifier(mode, timeout_s).score_many(responses, golds)
