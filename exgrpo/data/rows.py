"""One dataset row -> one `Prompt`: the question, the gold answer and the qid each layout reads, and the
columns a run's own reward function receives (`exgrpo.data.readers` reads the files and reports bad rows).
"""

from __future__ import annotations

import json
import math
from typing import Any, Literal

from exgrpo.core.records import Prompt
from exgrpo.verify.answers import last_boxed

Layout = Literal["plain", "verl", "openr1"]


class RowError(Exception):
    """This row is malformed; the message is the reason (reported as a `BadRow` by the reader)."""


def to_prompt(
    record: dict[str, Any],
    *,
    row: int,
    layout: Layout,
    source: str,
    question_key: str,
    answer_key: str,
    for_reward_fn: bool = False,
) -> Prompt:
    if layout == "plain":
        question = _question_text(record.get(question_key), f"column {question_key!r}")
    elif layout == "verl" or record.get("problem") is None:
        question = _last_user_message(record.get("prompt"))
    else:
        question = _question_text(record["problem"], "column 'problem'")
    try:
        answer = _layout_answer(record, layout, answer_key)
    except RowError:
        if not for_reward_fn:
            raise
        answer = ""  # a reward function may need no gold answer
    fields: dict[str, Any] = {}
    if for_reward_fn:
        used = _READ_COLUMNS[layout] | ({question_key, answer_key} if layout == "plain" else set())
        fields = {k: v for k, v in record.items() if k not in used}
        try:
            json.dumps(fields)
        except (TypeError, ValueError) as err:
            raise RowError(
                f"a column holds a value a reward function cannot receive as JSON ({err})"
            ) from err
    data_source = record.get("data_source")
    return Prompt(
        qid=_qid(record, row=row, source=source),
        question=question,
        answer=answer,
        data_source=data_source if isinstance(data_source, str) and data_source else source,
        fields=fields,
    )


_READ_COLUMNS: dict[Layout, set[str]] = {  # columns a layout reads itself (the rest become Prompt.fields)
    "plain": {"qid", "id", "data_source"},
    "verl": {"qid", "id", "data_source", "prompt", "reward_model"},
    "openr1": {"qid", "id", "data_source", "problem", "prompt", "answer", "reward_model", "target"},
}


def _layout_answer(record: dict[str, Any], layout: Layout, answer_key: str) -> str:
    if layout == "plain":
        return _answer_text(record.get(answer_key), f"column {answer_key!r}")
    if layout == "verl":
        return _answer_text(_ground_truth(record), "reward_model.ground_truth")
    return _openr1_answer(record)


def _qid(record: dict[str, Any], *, row: int, source: str) -> str:
    for key in ("qid", "id"):
        value = record.get(key)
        if value is not None and value != "":
            return str(value)
    extra = record.get("extra_info")
    if isinstance(extra, dict) and extra.get("index") is not None:
        return f"{source}:{extra['index']}"
    return f"{source}:{row}"


def _question_text(value: Any, where: str) -> str:
    if value is None:
        raise RowError(f"missing question ({where} is null or absent)")
    if not isinstance(value, str):
        raise RowError(f"question must be a string, got {type(value).__name__} in {where}")
    if not value.strip():
        raise RowError(f"empty question in {where}")
    return value


def _answer_text(value: Any, where: str) -> str:
    """Gold answers are strings; JSON numbers are accepted and written as text (42 -> "42")."""
    if value is None:
        raise RowError(f"missing answer ({where} is null or absent)")
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise RowError(f"answer must be a string or a number, got {type(value).__name__} in {where}")
    if isinstance(value, float) and not math.isfinite(value):
        raise RowError(f"answer must be a finite number, got {value} in {where}")
    text = str(value).strip()
    if not text:
        raise RowError(f"empty answer in {where}")
    return text


def _messages(value: Any, where: str) -> list[dict[str, Any]]:
    if value is None:
        raise RowError(f"missing {where}")
    if not isinstance(value, list) or not all(isinstance(m, dict) for m in value):
        raise RowError(f"{where} must be a list of {{role, content}} messages, got {type(value).__name__}")
    return value


def _last_user_message(value: Any) -> str:
    users = [m for m in _messages(value, "column 'prompt'") if m.get("role") == "user"]
    if not users:
        raise RowError("column 'prompt' has no user message")
    return _question_text(users[-1].get("content"), "the last user message of 'prompt'")


def _ground_truth(record: dict[str, Any]) -> Any:
    reward_model = record.get("reward_model")
    if reward_model is None:
        return None
    if not isinstance(reward_model, dict):
        raise RowError(
            f"column 'reward_model' must be a struct with ground_truth, got {type(reward_model).__name__}"
        )
    return reward_model.get("ground_truth")


def _openr1_answer(record: dict[str, Any]) -> str:
    if record.get("answer") is not None:
        return _answer_text(record["answer"], "column 'answer'")
    truth = _ground_truth(record)
    if truth is not None:
        return _answer_text(truth, "reward_model.ground_truth")
    if record.get("target") is None:
        raise RowError("missing answer (no 'answer', reward_model.ground_truth or 'target')")
    messages = _messages(record["target"], "column 'target'")
    if not messages:
        raise RowError("missing answer (column 'target' is empty)")
    content = _answer_text(messages[-1].get("content"), "the last message of 'target'")
    boxed = last_boxed(content)
    return boxed if boxed is not None else content
