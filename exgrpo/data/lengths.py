"""Prompt lengths against `model.max_prompt_len`: one rule for every engine, applied before any engine sees a prompt.

A prompt's length is the token count of its rendered text (the run's template) as the samplers' HF engine
tokenizes it (`add_special_tokens=False`). With `data.long_prompts: error` (the default) a data set holding
a longer prompt is refused, naming its rows (qid and length) and the fixes; with `skip` those prompts are
dropped with a count. So no engine ever receives a prompt over the budget: before, the HF engine trained on
it silently and vLLM cut the response to what the context left.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from exgrpo.core.config import TemplateName
from exgrpo.core.records import Prompt
from exgrpo.data.readers import DataError
from exgrpo.data.templates import render_prompt

SHOWN = 5  # long rows named in a message


@dataclass(frozen=True)
class LongPrompts:
    """The prompts kept and the long ones (qid, tokens) of one data set."""

    kept: list[Prompt]
    long: list[tuple[str, int]]


def prompt_tokens(prompt: Prompt, *, template: TemplateName, tokenizer: Any) -> int:
    """Tokens of the rendered prompt, as the HF engine counts them."""
    text = render_prompt(prompt.question, template=template, tokenizer=tokenizer)
    return len(tokenizer.encode(text, add_special_tokens=False))


def check_prompt_lengths(
    prompts: Sequence[Prompt],
    *,
    template: TemplateName,
    tokenizer: Any,
    limit: int,
    policy: Literal["error", "skip"],
    what: str,
) -> LongPrompts:
    """The prompts within `limit` tokens; the longer ones raise a `DataError` naming them (`policy="error"`)
    or are left out and returned in `long` (`"skip"`). `what` names the data set in messages."""
    kept: list[Prompt] = []
    long: list[tuple[str, int]] = []
    for p in prompts:
        n = prompt_tokens(p, template=template, tokenizer=tokenizer)
        if n > limit:
            long.append((p.qid, n))
        else:
            kept.append(p)
    if long and policy == "error":
        raise DataError(
            f"{what}: {len(long)} of {len(prompts)} prompts are longer than model.max_prompt_len={limit} tokens "
            f"({describe(long)}); raise model.max_prompt_len, or set data.long_prompts=skip to leave them out"
        )
    if long and not kept:
        raise DataError(
            f"{what}: every prompt is longer than model.max_prompt_len={limit} tokens ({describe(long)}); "
            "raise model.max_prompt_len"
        )
    return LongPrompts(kept, long)


def describe(long: Sequence[tuple[str, int]]) -> str:
    """The first long rows: `qid q7: 41 tokens, ...`."""
    more = f", ... {len(long) - SHOWN} more" if len(long) > SHOWN else ""
    return ", ".join(f"qid {qid}: {n} tokens" for qid, n in long[:SHOWN]) + more
