"""Answer extraction: the box format, the final answer of a response, gold cleaning (pure, no sympy).

The box format is spelt once, here (`BOX_COMMAND`, `boxed`, `last_boxed`: one linear scan with a brace stack).
`prepare` reads what the verifier compares, as math-verify reads an answer: the answer region ("boxed" or
"think" mode), the final boxes as one answer (a set), else the stated final answer; `equation_values` applies the
equation rule. What is read and what counts as equal: docs/rewards.md ("Extraction: where the answer is",
"Several boxes", "Numbers and normalisation", "The equation rule"); tests: tests/exgrpo/verify/test_answers.py.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from exgrpo.core.config import RewardMode

BOX_COMMAND = "\\boxed"  # the box the final answer goes in: `\\boxed{42}`
BOX_OPEN = BOX_COMMAND + "{"

_TOKEN = re.compile(
    re.escape(BOX_COMMAND) + r"(?![A-Za-z])|\\.|[{}]", re.DOTALL
)  # box command, escape, brace
_SPACES = re.compile(r"\s*")
_BARE_ARG = re.compile(r"[ \t]+([^\s${}]*[^\s${}.,;:])")  # `\boxed 5` (a sentence's final `.` is not in it)
_SEPARATOR = re.compile(r"\b(and|or)\b|,|;")  # what may join two boxes of one answer (math-verify's)
_DIGIT_GROUPS = re.compile(r"(?<![\d.])\d{1,3}(?:(?:\\[,;:!]|\\ |~| )\d{3})+(?![\d])")
_GROUP_SEPARATOR = re.compile(r"\\[,;:!]|\\ |~| ")
_LEFT_RIGHT = re.compile(r"\\(?:left|right)(?![A-Za-z])\s*(?=[()\[\]])")

_GREEK = (
    "alpha|beta|gamma|delta|epsilon|varepsilon|zeta|eta|theta|vartheta|iota|kappa|lambda|mu|nu|xi|pi|"
    "rho|sigma|tau|upsilon|phi|varphi|chi|psi|omega|Gamma|Delta|Theta|Lambda|Xi|Pi|Sigma|Phi|Psi|Omega"
)
_NAME = re.compile(
    r"(?:m?\\angle\s*)?"
    r"(?:[A-Za-z]{1,3}|\\(?:" + _GREEK + r")(?![A-Za-z])"
    r"|\\(?:text|mathrm|mathit|operatorname)\s*\{\s*[A-Za-z][A-Za-z ]*\}"
    r"|\\(?:overline|bar|vec|hat|mathbf)\s*\{\s*[A-Za-z]{1,3}\s*\})"
    r"(?:\s*_\s*(?:\{\s*[A-Za-z0-9]+\s*\}|[A-Za-z0-9]))?'*"
    r"(?:\s*\([^()]*\))?"
)
# Relations at the top level of an answer: `=` and what reads like it, approximations, the rest.
_RELATION = re.compile(
    r"\\(?P<command>approx|simeq|sim|doteq|cong|equiv|coloneqq|ne|neq|le|leq|ge|geq|leqslant|geqslant|lt|gt|"
    r"ll|gg|propto|to|rightarrow|Rightarrow|implies|iff|in|notin|ni|subset|subseteq|supset|supseteq|mapsto)"
    r"(?![A-Za-z])|(?P<symbol>:=|<=|>=|!=|==|=|<|>|≈|≤|≥|≠)"
)
_SCAN = re.compile(r"\\[{}]|[()\[\]{}]|" + _RELATION.pattern)  # brackets (escaped or not), relations
_EQUALS = frozenset({"=", "==", ":=", "coloneqq", "in"})
_APPROX = frozenset({"approx", "simeq", "sim", "doteq", "≈"})
_LEADING_SPACE = re.compile(r"(?:\s|~|\\[ ,;:!]|\\q?quad(?![A-Za-z]))*")  # white space, LaTeX spacing
_TRAILING_SPACE = ("~", "\\ ", "\\,", "\\;", "\\:", "\\!", "\\quad", "\\qquad")
_OPEN = "([{"
_CLOSE = ")]}"


def boxed(answer: str | int) -> str:
    """`answer` written in the box format: `boxed(413) == "\\\\boxed{413}"` (what `last_boxed` reads)."""
    return f"{BOX_OPEN}{answer}}}"


@dataclass(frozen=True)
class _Box:
    command: int  # where `\boxed` starts
    start: int  # content span (not stripped)
    end: int


def _boxes(text: str) -> list[_Box]:
    """Every box of `text` that closes, in the order they close (an inner box before its outer one)."""
    found: list[_Box] = []
    opens: list[tuple[int, int]] = []  # per open brace: (box command, content start) or (-1, -1)
    box_brace, box_command = -1, -1  # the `{` that follows the latest `\boxed`, and that command
    for m in _TOKEN.finditer(text):
        token = m.group()
        if token == "{":
            opens.append((box_command, m.end()) if m.start() == box_brace else (-1, -1))
        elif token == "}":
            if opens and (opened := opens.pop())[0] >= 0:
                found.append(_Box(opened[0], opened[1], m.start()))
        elif token == BOX_COMMAND:
            after = _SPACES.match(text, m.end()).end()
            if after < len(text) and text[after] == "{":
                box_brace, box_command = after, m.start()
            elif bare := _BARE_ARG.match(text, m.end()):
                found.append(_Box(m.start(), *bare.span(1)))
    return found


def last_boxed(text: str) -> str | None:
    """Content (stripped) of the last `\\boxed{...}` in `text` to close, or of a brace-less `\\boxed 5`.

    Braces nest; `\\{` and `\\}` are escapes (literal braces) that neither open nor close, so
    `\\boxed{x\\}y}` gives `x\\}y`; `\\boxed 5.` gives `5` (the run of characters after the
    spaces up to a space, `$` or brace, less trailing `.,;:`). A box that never closes is ignored
    (an earlier complete one wins). None when no box closes or the last one is empty. Linear time
    in len(text).
    """
    found = _boxes(text)
    return (text[found[-1].start : found[-1].end].strip() or None) if found else None


def final_boxes(text: str) -> list[str]:
    """The contents (stripped) of the boxes that make the final answer, in order; [] if none.

    The last box to close, and before it every box that math-verify reads as part of the same
    answer: fewer than 10 characters between the two, or fewer than 70 that contain `and`, `or`,
    `,` or `;` while the contents differ. Consecutive identical contents count once. Boxes inside
    a box are part of its content. [] when the last box is empty. Linear time in len(text).
    """
    found = _boxes(text)
    if not found:
        return []
    outer: list[_Box] = []  # boxes not inside another box, in text order
    for box in found:  # an outer box closes after the boxes inside it
        while outer and outer[-1].command > box.command:
            outer.pop()
        outer.append(box)
    contents = [text[outer[-1].start : outer[-1].end].strip()]
    if not contents[0]:
        return []
    for before, after in zip(reversed(outer[:-1]), reversed(outer[1:]), strict=True):
        between = text[before.end + 1 : after.command]
        content = text[before.start : before.end].strip()
        joined = len(between) < 10 or (
            content != contents[-1] and len(between) < 70 and _SEPARATOR.search(between) is not None
        )
        if not joined or not content:
            break
        if content != contents[-1]:
            contents.append(content)
    return contents[::-1]


def answer_region(response: str, mode: RewardMode = "boxed") -> str | None:
    """The part of `response` the answer is read from: all of it ("boxed"), or the text after the
    first `</think>`, which a `<think>` must precede ("think"; None without them)."""
    if mode == "think":
        close = response.find("</think>")
        if close < 0 or response.find("<think>", 0, close) < 0:
            return None
        return response[close + len("</think>") :]
    if mode != "boxed":
        raise ValueError(f"mode must be 'boxed' or 'think', got {mode!r}")
    return response


def extract_answer(response: str, *, mode: RewardMode = "boxed") -> str | None:
    """The last box of `response`'s answer region (`last_boxed`), or None when there is none.

    "boxed": the whole response; "think": only after the first `</think>`, which a `<think>` must
    precede. Linear time in len(response). The verifier reads several final boxes (`final_answer`).
    """
    region = answer_region(response, mode)
    return None if region is None else last_boxed(region)


def final_answer(response: str, *, mode: RewardMode = "boxed") -> str | None:
    """The final boxes of the answer region joined by commas (`final_boxes`), or None if no box."""
    region = answer_region(response, mode)
    contents = final_boxes(region) if region is not None else []
    return ",".join(contents) if contents else None


def normalize(answer: str) -> str:
    """`answer` with `\\left`/`\\right` before brackets, digit-group spaces and redundant
    parentheses removed: `\\left((1 000)\\right)` -> `(1000)`. Linear time."""
    answer = _LEFT_RIGHT.sub("", answer)
    answer = _DIGIT_GROUPS.sub(lambda m: _GROUP_SEPARATOR.sub("", m.group()), answer)
    if answer.count("(") < 2:
        return answer.strip()
    match: dict[int, int] = {}  # open paren -> its close
    drop: set[int] = set()
    stack: list[int] = []
    for i, char in enumerate(answer):
        if char == "(" and (i == 0 or answer[i - 1] != "\\"):
            stack.append(i)
        elif char == ")" and stack and answer[i - 1] != "\\":
            start = stack.pop()
            match[start] = i
            if match.get(start + 1) == i - 1:  # `((...))`: the outer pair adds nothing
                drop.update((start, i))
    if not drop:
        return answer.strip()
    return "".join(c for i, c in enumerate(answer) if i not in drop).strip()


def clean_gold(gold: str) -> str:
    """Gold as the verifier compares it: stripped, enclosing `$...$` removed, a gold written boxed
    read as its final boxes (`\\boxed{1}\\boxed{2}` -> `1,2`), then `normalize`d."""
    gold = gold.strip()
    while len(gold) >= 2 and gold[0] == "$" and gold[-1] == "$":
        gold = gold[1:-1].strip()
    if BOX_COMMAND in gold:
        gold = ",".join(final_boxes(gold)) or gold
    return normalize(gold)


def _top_level(text: str) -> tuple[list[str], list[str]]:
    """`text` cut at its top-level relations: (sides, relations), len(sides) == len(relations) + 1.
    Top level: outside every bracket `( [ {` (escaped or not; `[1,2)` counts as balanced)."""
    sides: list[str] = []
    relations: list[str] = []
    depth, start = 0, 0
    for m in _SCAN.finditer(text):
        token = m.group()
        if m.group("command") or m.group("symbol"):
            if depth <= 0:
                sides.append(text[start : m.start()])
                relations.append(m.group("command") or m.group("symbol"))
                start = m.end()
        elif token[-1] in _OPEN:
            depth += 1
        elif token[-1] in _CLOSE:
            depth -= 1
    sides.append(text[start:])
    return sides, relations


def _split_items(text: str) -> list[str]:
    """`text` cut at its top-level `,` and `;`."""
    items, depth, start = [], 0, 0
    for i, char in enumerate(text):
        if char in _OPEN:
            depth += 1
        elif char in _CLOSE:
            depth -= 1
        elif char in ",;" and depth <= 0 and (i == 0 or text[i - 1] != "\\"):
            items.append(text[start:i])
            start = i + 1
    items.append(text[start:])
    return items


def has_relation(text: str) -> bool:
    """Whether `text` states a relation (`=`, `<`, `\\approx`, ...) at its top level."""
    return bool(_top_level(text)[1])


def _strip(text: str) -> str:
    """`text` without surrounding white space or LaTeX spacing (`\\ `, `\\,`, `\\quad`, `~`, ...)."""
    start, end = _LEADING_SPACE.match(text).end(), len(text)
    while end > start:
        if text[end - 1].isspace():
            end -= 1
        elif (cut := next((s for s in _TRAILING_SPACE if text.endswith(s, start, end)), None)) and not (
            text.endswith("\\\\", start, end)  # `\\` ends a line; it is no spacing command
        ):
            end -= len(cut)
        else:
            break
    return text[start:end]


def _item_values(item: str) -> list[str] | None:
    sides, relations = _top_level(item)
    if not relations:
        return [_strip(item)]
    if relations[0] not in _EQUALS or _NAME.fullmatch(_strip(sides[0])) is None:
        return None  # `43 = 42`, `1+1 = 42`, `x \approx 42`, `x < 42`
    values = []
    for relation, value in zip(relations, sides[1:], strict=True):
        if relation in _APPROX:
            break  # `x = 1/3 \approx 0.33`: the approximation of a value already given
        if relation not in _EQUALS or not _strip(value):
            return None
        values.append(_strip(value))
    return values


def equation_values(answer: str, gold: str) -> list[str] | None:
    """What must each verify against `gold` for `answer` to be right, or None (it is wrong).

    `[answer]` when the answer states no relation or the gold states one (math-verify compares
    relations itself). Otherwise each top-level item of the answer (cut at `,`, `;`) that states a
    relation must read `name = value` with a bare variable name: `x = 1, y = 2` gives `["1, 2"]`;
    a single item may chain, and every value must be right: `x = 2+2 = 4` gives `["2+2", "4"]`.
    """
    if not has_relation(answer) or has_relation(gold):
        return [answer]
    items = [_item_values(item) for item in _split_items(answer)]
    if any(values is None or not values for values in items):
        return None
    if len(items) == 1:
        return items[0]
    if any(len(values) != 1 for values in items):
        return None  # chains only in a one-item answer
    return [", ".join(values[0] for values in items)]


__all__ = [
    "BOX_COMMAND",
    "BOX_OPEN",
    "RewardMode",
    "answer_region",
    "boxed",
    "clean_gold",
    "equation_values",
    "extract_answer",
    "final_answer",
    "final_boxes",
    "has_relation",
    "last_boxed",
    "normalize",
]
