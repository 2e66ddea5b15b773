"""The verification worker: the program each `exgrpo.verify.pool` worker process runs.

It reads one JSON line per job on stdin, `[kind, payloads, gold, timeout_s, fields]`, and writes one reply
line on stdout. Math jobs ("values", "text") reply `1` or `0`: whether math-verify (sympy) finds the answer
equivalent to the gold. With `EXGRPO_REWARD_FN` set, the worker instead serves a user's reward function
(`exgrpo.verify.plugin`): a "reward" job's payloads are `[prompt, completion]`, the reply is the float it
returned, or `e <json [kind, text]>` when it raised (kind "raised", text the exception's type and message)
or returned something that is not a finite number (kind "not a number", text what it returned). It runs as
`python -c "from exgrpo.verify.worker import worker_main; worker_main()"`, loads what it serves, then
announces `READY`. The parent owns the deadline; this side only adds backstops (RLIMIT_CPU per job,
RLIMIT_AS) for a parent that died mid-job. Nothing here reads or writes files.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import signal
import sys
from collections.abc import Callable
from functools import lru_cache
from typing import Any

from exgrpo.verify.answers import boxed, equation_values, has_relation, normalize
from exgrpo.verify.plugin import resolve

READY = b"ready"
ERROR = b"e"  # a reward function raised or returned no finite number (scored 0, counted); + b" [kind, text]"
RAISED, NOT_A_NUMBER, TIMED_OUT = "raised", "not a number", "timed out"  # the kinds of a reward failure
_TEXT_CHARS = 300  # of an exception's message or a returned value's repr, in a failure's reply
REWARD_FN_ENV = "EXGRPO_REWARD_FN"  # the reward.fn spec a worker serves instead of math-verify
_HUGE_LOG10 = 1e6  # numbers past 10^(10^6) are judged without being computed


def _log10(expr: object) -> float | None:
    """log10 |expr| estimated from its literals for numbers, powers and factorials (never evaluated)."""
    if getattr(expr, "is_Integer", False):
        digits = str(abs(int(expr)))  # a parsed literal: at most as long as the answer
        return math.log10(int(digits)) if len(digits) < 300 and digits != "0" else len(digits) - 1.0
    if getattr(expr, "is_Number", False):
        return math.log10(abs(float(expr))) if expr != 0 else None
    if getattr(expr, "is_Pow", False) and expr.exp.is_positive:
        base, exponent = _log10(expr.base), _log10(expr.exp)
        if base is None or exponent is None or base <= 0:
            return None
        return base * (10.0**exponent if exponent < 300 else math.inf)
    if type(expr).__name__ == "factorial" and (n := _log10(expr.args[0])) is not None:
        return 10.0**n * n if n < 300 else math.inf
    return None


def _huge(expr: object) -> bool:
    """Whether a power or factorial in `expr` exceeds 10^(10^6) (sympy would try to compute it)."""
    from sympy import Basic, preorder_traversal

    if not isinstance(expr, Basic):
        return False
    try:
        return any(
            (size := _log10(node)) is not None and size > _HUGE_LOG10
            for node in preorder_traversal(expr)
            if node.is_Pow or type(node).__name__ == "factorial"
        )
    except Exception:
        return False


def _math_judge() -> Callable[[str, list[str], str, Any], bytes]:
    """Load math-verify and return the judge of math jobs (b"1" / b"0")."""
    # math-verify warns that its own (SIGALRM) timeouts are off; the parent owns the deadline.
    logging.getLogger("math_verify").setLevel(logging.CRITICAL)
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    boxed_configs = [LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig()]
    text_configs = [LatexExtractionConfig(), ExprExtractionConfig()]  # math-verify's own defaults

    def parse_boxed(text: str) -> list:
        return parse(boxed(text), extraction_config=boxed_configs, parsing_timeout=None)

    parse_gold = lru_cache(maxsize=1024)(parse_boxed)  # the K rollouts of a question share one gold

    def right(answer_parsed: list, gold: str) -> bool:
        gold_parsed = parse_gold(gold)
        if any(map(_huge, answer_parsed)) and not any(map(_huge, gold_parsed)):
            return False  # a number of > 10^6 digits equals no ordinary gold; sympy would compute it
        return bool(
            gold_parsed and answer_parsed and verify(gold_parsed, answer_parsed, timeout_seconds=None)
        )

    def equivalent(kind: str, payloads: list[str], gold: str) -> bool:
        if kind == "values":  # every value must verify
            return bool(payloads) and all(right(parse_boxed(value), gold) for value in payloads)
        parsed = parse(payloads[0], extraction_config=text_configs, parsing_timeout=None)
        stated = next((p for p in parsed if isinstance(p, str)), None)  # the text math-verify read
        if stated is not None and has_relation(stated) and not has_relation(gold):
            values = equation_values(normalize(stated), gold)
            return values is not None and equivalent("values", values, gold)
        return right(parsed, gold)

    equivalent("values", ["1"], "1")  # warm-up (regex compilation) before the first deadline starts
    equivalent("text", ["so 1"], "1")
    equivalent("values", ["x^2+2x+1"], "(x+1)^2")  # sympy's first simplify is slow (~0.6 s)

    def judge(kind: str, payloads: list[str], gold: str, fields: Any) -> bytes:
        try:
            return b"1" if equivalent(kind, payloads, gold) else b"0"
        except Exception:  # unparsable or pathological text: not equivalent
            return b"0"

    return judge


def failure_reply(kind: str, text: str) -> bytes:
    """The reply line of a reward that failed: `e [kind, text]` (one line: JSON escapes newlines)."""
    return ERROR + b" " + json.dumps([kind, text[:_TEXT_CHARS]]).encode()


def _reward_judge(spec: str) -> Callable[[str, list[str], str, Any], bytes]:
    """Load a user's reward function and return the judge of "reward" jobs (a float, or a failure reply)."""
    fn = resolve(spec).fn

    def judge(kind: str, payloads: list[str], gold: str, fields: Any) -> bytes:
        try:
            value = fn(payloads[0], payloads[1], dict(fields or {}))
        except Exception as err:  # the function raised: scored 0, counted and shown by the parent
            return failure_reply(RAISED, f"{type(err).__name__}: {err}")
        if isinstance(value, bool):
            value = float(value)
        if not isinstance(value, int | float) or not math.isfinite(value):
            return failure_reply(NOT_A_NUMBER, f"returned {type(value).__name__} {_short_repr(value)}")
        return repr(float(value)).encode()

    return judge


def _short_repr(value: object) -> str:
    try:
        return repr(value)[:_TEXT_CHARS]
    except Exception:  # a user's object whose __repr__ raises
        return "(no repr)"


def worker_main() -> None:
    """Worker loop (run as `python -c`): read JSON [kind, payloads, gold, timeout_s, fields] lines on
    stdin, write one reply line per job (see the module docstring)."""
    import resource

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's business
    replies = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # stray prints from libraries go to stderr, not into the reply pipe
    memory_mb = int(os.environ.get("EXGRPO_VERIFY_MAX_MEMORY_MB", "0"))
    if memory_mb > 0:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_AS, (memory_mb * 2**20, memory_mb * 2**20))
    spec = os.environ.get(REWARD_FN_ENV)
    judge = _reward_judge(spec) if spec else _math_judge()
    replies.write(READY + b"\n")
    replies.flush()
    _, cpu_hard = resource.getrlimit(resource.RLIMIT_CPU)
    for line in sys.stdin.buffer:  # ends when the parent closes the pipe or exits
        try:
            kind, payloads, gold, timeout_s, fields = json.loads(line)
            # Backstop if the parent dies mid-job: the kernel kills a job past its CPU budget.
            used = sum(resource.getrusage(resource.RUSAGE_SELF)[:2])
            soft = int(used + timeout_s) + 2
            if cpu_hard == resource.RLIM_INFINITY or soft < cpu_hard:
                resource.setrlimit(resource.RLIMIT_CPU, (soft, cpu_hard))
            reply = judge(kind, payloads, gold, fields)
        except Exception as err:  # a malformed job line: no verdict
            reply = failure_reply(RAISED, f"bad job line: {err}") if spec else b"0"
        replies.write(reply + b"\n")
        replies.flush()
