"""Prompt templates: a question in, the exact text the model continues from out.

`plain` ("Q: ...\\nA: ", for the tiny character-level model), `chat` (the tokenizer's chat template, the
question plus a line asking for `\\boxed{}`), `chat-short` (the chat template with a one-line system turn in place
of the template's default one: about half of `chat`'s prompt tokens on short questions, which the learner pays for
in every forward), `think` (the paper's setting: a system prompt asking for reasoning inside `<think> </think>`,
then the answer in `\\boxed{}`) and `llama-base` (the question and a step-by-step suffix, for base models
without a chat template). `reward_mode(template)` tells the verifier where the final answer is. Choices:
docs/config.md (`model.template`); tests: tests/exgrpo/data/test_data.py.
"""

from __future__ import annotations

from typing import Any, get_args

from exgrpo.core.config import RewardMode, TemplateName
from exgrpo.verify.answers import boxed

TEMPLATES: tuple[str, ...] = get_args(TemplateName)

_EMPTY_BOX = boxed("")  # `\\boxed{}`, as the instructions name the answer format
BOXED_INSTRUCTION = f"Please reason step by step, and put your final answer within {_EMPTY_BOX}."
THINK_SYSTEM_PROMPT = (
    "You are a careful problem solver. First think the problem through: reason step by step, "
    "check your work and correct mistakes, writing all of this inside <think> </think> tags. "
    "After </think>, write a short, clear solution that follows from your reasoning and put "
    f"the final answer within {_EMPTY_BOX}."
)
SHORT_SYSTEM_PROMPT = f"Give the final answer within {_EMPTY_BOX}."
LLAMA_BASE_SUFFIX = f"Let's think step by step and output the final answer within {_EMPTY_BOX}."


class TemplateError(ValueError):
    """An unknown template, or a template the given tokenizer cannot render."""


def render_prompt(question: str, *, template: TemplateName, tokenizer: Any = None) -> str:
    """The prompt text for one question; the model's response starts right after it.

    `tokenizer` is a transformers tokenizer (only its `chat_template` and
    `apply_chat_template` are used); it is required by `chat` and optional for `think`.
    """
    if template == "plain":
        return f"Q: {question}\nA: "
    if template == "llama-base":
        return f"{question} {LLAMA_BASE_SUFFIX}\n"
    if template == "chat":
        if not _has_chat_template(tokenizer):
            raise TemplateError(
                "template 'chat' needs a tokenizer with a chat template; "
                "use template 'plain' or 'llama-base' for models without one"
            )
        return _apply_chat(tokenizer, [{"role": "user", "content": f"{question}\n{BOXED_INSTRUCTION}"}])
    if template == "chat-short":
        if not _has_chat_template(tokenizer):
            raise TemplateError(
                "template 'chat-short' needs a tokenizer with a chat template; "
                "use template 'plain' or 'llama-base' for models without one"
            )
        return _with_system(tokenizer, SHORT_SYSTEM_PROMPT, question)
    if template == "think":
        if not _has_chat_template(tokenizer):
            return f"System: {THINK_SYSTEM_PROMPT}\n\nUser: {question}\n\nAssistant: "
        return _with_system(tokenizer, THINK_SYSTEM_PROMPT, question)
    raise TemplateError(f"unknown template {template!r}; choose one of {', '.join(TEMPLATES)}")


def reward_mode(template: TemplateName) -> RewardMode:
    """`"think"` (answer after `</think>`) for the think template, else `"boxed"` (last `\\boxed{}`)."""
    if template not in TEMPLATES:
        raise TemplateError(f"unknown template {template!r}; choose one of {', '.join(TEMPLATES)}")
    return "think" if template == "think" else "boxed"


def _with_system(tokenizer: Any, system: str, question: str) -> str:
    """The chat template on a system turn and the question; folded into the user turn where the template
    rejects a system role."""
    messages = [{"role": "system", "content": system}, {"role": "user", "content": question}]
    try:
        return _apply_chat(tokenizer, messages)
    except Exception:  # some chat templates reject a system role: fold it into the user turn
        return _apply_chat(tokenizer, [{"role": "user", "content": f"{system}\n\n{question}"}])


def _has_chat_template(tokenizer: Any) -> bool:
    return tokenizer is not None and bool(getattr(tokenizer, "chat_template", None))


def _apply_chat(tokenizer: Any, messages: list[dict[str, str]]) -> str:
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    if not isinstance(text, str):
        raise TemplateError(f"apply_chat_template returned {type(text).__name__}, expected the prompt text")
    return text
