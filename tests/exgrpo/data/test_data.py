"""Dataset readers (every layout, both formats, bad rows) and prompt templates."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from exgrpo.core.records import Prompt
from exgrpo.data.readers import BadRow, DataError, read_prompts, write_prompts
from exgrpo.data.templates import (
    SHORT_SYSTEM_PROMPT,
    THINK_SYSTEM_PROMPT,
    TemplateError,
    render_prompt,
    reward_mode,
)
from exgrpo.verify.answers import BOX_COMMAND, boxed, extract_answer, final_answer, last_boxed
from exgrpo.verify.verifier import Verifier


def _write(rows: list[dict[str, Any]], path: Path) -> Path:
    """A fixture file in the format its suffix names (parquet through pyarrow's type inference)."""
    if path.suffix == ".parquet":
        pq.write_table(pa.Table.from_pylist(rows), path)
    else:
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _chat(role: str, content: str) -> dict[str, str]:
    return {"role": role, "content": content}


FORMATS = [".parquet", ".jsonl"]


# ------------------------------------------------------------------------- layouts


@pytest.mark.parametrize("suffix", FORMATS)
def test_plain_layout(tmp_path: Path, suffix: str) -> None:
    rows = [{"question": "1+1", "answer": "2"}, {"question": "What is 3*4?", "answer": "12"}]
    result = read_prompts(_write(rows, tmp_path / f"toy{suffix}"))
    assert result.layout == "plain"
    assert result.skipped == ()
    # no id column: qid = "{file stem}:{row}", data_source = file stem
    assert result.prompts == (
        Prompt(qid="toy:0", question="1+1", answer="2", data_source="toy"),
        Prompt(qid="toy:1", question="What is 3*4?", answer="12", data_source="toy"),
    )


@pytest.mark.parametrize("suffix", FORMATS)
def test_plain_layout_custom_keys_and_source(tmp_path: Path, suffix: str) -> None:
    rows = [{"q": "2+2", "gold": "4", "id": "a7"}, {"q": "5-1", "gold": "4", "id": "a8"}]
    result = read_prompts(
        _write(rows, tmp_path / f"f{suffix}"), question_key="q", answer_key="gold", source_name="mini"
    )
    assert [(p.qid, p.question, p.answer, p.data_source) for p in result.prompts] == [
        ("a7", "2+2", "4", "mini"),
        ("a8", "5-1", "4", "mini"),
    ]


@pytest.mark.parametrize("suffix", FORMATS)
def test_verl_layout(tmp_path: Path, suffix: str) -> None:
    rows = [
        {
            "data_source": "gsm8k",
            "prompt": [
                _chat("system", "be brief"),
                _chat("user", "first try"),
                _chat("assistant", "hm"),
                _chat("user", "What is 6*7?"),
            ],
            "reward_model": {"style": "rule", "ground_truth": "42"},
            "extra_info": {"index": 17, "split": "train"},
        },
        {
            "data_source": "math",
            "prompt": [_chat("user", "Half of one?")],
            "reward_model": {"style": "rule", "ground_truth": "\\frac{1}{2}"},
            "extra_info": {"index": 3, "split": "train"},
        },
    ]
    result = read_prompts(_write(rows, tmp_path / f"mix{suffix}"))
    assert result.layout == "verl"
    # the question is the LAST user message; qid = "{stem}:{extra_info.index}"; data_source per row
    assert result.prompts == (
        Prompt(qid="mix:17", question="What is 6*7?", answer="42", data_source="gsm8k"),
        Prompt(qid="mix:3", question="Half of one?", answer="\\frac{1}{2}", data_source="math"),
    )


@pytest.mark.parametrize("suffix", FORMATS)
def test_openr1_layout_prompt_target_reward_model(tmp_path: Path, suffix: str) -> None:
    # the shape of OpenR1-Math-46k: the gold answer in reward_model, a long solution in target
    rows = [
        {
            "data_source": "openr1",
            "prompt": [_chat("user", "Find x if 2x = 10.")],
            "target": [_chat("assistant", "<think>2x = 10 so x = 5</think> So \\boxed{5}")],
            "ability": "math",
            "reward_model": {"ground_truth": "5", "style": "rule"},
            "extra_info": {"index": 0, "split": "default"},
        },
        {
            "data_source": "openr1",
            "prompt": [_chat("user", "Compute 1/2 + 1/4.")],
            "target": [_chat("assistant", "<think>...</think> \\boxed{\\frac{3}{4}}")],
            "ability": "math",
            "reward_model": {"ground_truth": "\\frac{3}{4}", "style": "rule"},
            "extra_info": {"index": 1, "split": "default"},
        },
    ]
    result = read_prompts(_write(rows, tmp_path / f"openr1{suffix}"))
    assert result.layout == "openr1"
    assert [(p.qid, p.question, p.answer) for p in result.prompts] == [
        ("openr1:0", "Find x if 2x = 10.", "5"),
        ("openr1:1", "Compute 1/2 + 1/4.", "\\frac{3}{4}"),
    ]


@pytest.mark.parametrize("suffix", FORMATS)
def test_openr1_layout_problem_answer_and_target_only(tmp_path: Path, suffix: str) -> None:
    raw = [{"problem": "What is 9-4?", "answer": "5", "solution": "9-4=5"}]
    result = read_prompts(_write(raw, tmp_path / f"raw{suffix}"))
    assert result.layout == "openr1"
    assert result.prompts[0].question == "What is 9-4?" and result.prompts[0].answer == "5"

    # no separate gold: the last \boxed{} of the last target message, else that whole message
    target_only = [
        {
            "prompt": [_chat("user", "p0")],
            "target": [_chat("assistant", "a \\boxed{1} then \\boxed{\\sqrt{2}}")],
        },
        {"prompt": [_chat("user", "p1")], "target": [_chat("assistant", "7")]},
    ]
    result = read_prompts(_write(target_only, tmp_path / f"t{suffix}"))
    assert [p.answer for p in result.prompts] == ["\\sqrt{2}", "7"]


# Inputs on which the data cleaner and the verifier once disagreed (the reader had its own
# extractor): one extractor now reads every box, so every path gives the same answer.
ONE_ANSWER = [
    ("so \\boxed 5", "5"),  # TeX's brace-less argument (the reader found no box)
    ("\\boxed{x\\}y}", "x\\}y"),  # an escaped brace does not close (the reader stopped at it)
    ("\\boxed{\\{1,2\\}}", "\\{1,2\\}"),  # escaped braces are literal braces
    ("\\boxed{3} and \\boxed{}", None),  # the last box is empty (the reader fell back to 3)
    ("x \\boxed{\\frac{1}{2}} y", "\\frac{1}{2}"),
    ("\\boxed{1} and \\boxed {2}", "2"),
    ("\\boxed{3} \\boxed{unclosed", "3"),  # a box that never closes is ignored
    ("no box", None),
]


@pytest.mark.parametrize(("text", "expected"), ONE_ANSWER)
def test_one_box_extractor_for_data_and_rewards(tmp_path: Path, text: str, expected: str | None) -> None:
    assert last_boxed(text) == expected
    assert extract_answer(text) == expected  # the reward path reads responses with it
    # the data path: an openr1 row with no gold column takes its answer from the target's last box
    rows = [{"prompt": [_chat("user", "q")], "target": [_chat("assistant", text)]}]
    (prompt,) = read_prompts(_write(rows, tmp_path / "t.jsonl")).prompts
    assert prompt.answer == (text if expected is None else expected)
    if expected is not None and final_answer(text) == expected:  # several final boxes: one answer, a list
        # a gold written boxed is unboxed by the same extractor: response and gold agree exactly
        # (fast path, no worker process)
        with Verifier() as verifier:
            assert verifier.score_many([text, boxed(expected)], [boxed(expected), text]) == [1.0, 1.0]
            assert verifier.stats().fast == 2


def test_box_format_is_spelt_once() -> None:
    assert boxed(413) == BOX_COMMAND + "{413}" == "\\boxed{413}"
    assert last_boxed(boxed("\\frac{1}{2}")) == "\\frac{1}{2}"


def test_layout_forced_and_mismatch(tmp_path: Path) -> None:
    path = _write([{"question": "q", "answer": "a"}], tmp_path / "p.jsonl")
    assert read_prompts(path, layout="plain").layout == "plain"
    with pytest.raises(DataError, match="does not fit layout 'verl'"):
        read_prompts(path, layout="verl")
    odd = _write([{"text": "q", "label": "a"}], tmp_path / "odd.jsonl")
    with pytest.raises(DataError, match=r"cannot detect the layout.*\['label', 'text'\]"):
        read_prompts(odd)


def test_unknown_suffix_and_missing_file(tmp_path: Path) -> None:
    csv = tmp_path / "d.csv"
    csv.write_text("question,answer\n1+1,2\n")
    with pytest.raises(DataError, match=r"unknown suffix '\.csv'.*\.parquet"):
        read_prompts(csv)
    with pytest.raises(DataError, match="does not exist$"):
        read_prompts(tmp_path / "nope.parquet")
    # a file the benchmark builder writes: the error names the command that writes it
    with pytest.raises(DataError, match=r"exgrpo\.data\.benchmarks --out \S+ --only math500` writes it"):
        read_prompts(tmp_path / "math500.parquet")
    garbage = tmp_path / "garbage.parquet"
    garbage.write_bytes(b"PAR1 this is not parquet")
    with pytest.raises(DataError, match="not a readable parquet file"):
        read_prompts(garbage)
    with pytest.raises(DataError, match="unknown suffix"):
        write_prompts([], tmp_path / "out.txt")


# ------------------------------------------------------------------------- bad rows

BAD_ROWS = [
    {"question": "ok 0", "answer": "0"},  # row 0: fine
    {"question": "no answer", "answer": None},  # row 1: null answer
    {"question": "ok 2", "answer": "2"},  # row 2: fine
    {"question": "   ", "answer": "3"},  # row 3: empty question
    {"question": None, "answer": "4"},  # row 4: missing question
    {"question": "ok 5", "answer": ""},  # row 5: empty answer
]


@pytest.mark.parametrize("suffix", FORMATS)
def test_bad_rows_skipped_with_row_numbers(tmp_path: Path, suffix: str) -> None:
    result = read_prompts(_write(BAD_ROWS, tmp_path / f"bad{suffix}"), on_bad_row="skip")
    assert [p.question for p in result.prompts] == ["ok 0", "ok 2"]
    assert [b.row for b in result.skipped] == [1, 3, 4, 5]
    reasons = [b.reason for b in result.skipped]
    assert "missing answer" in reasons[0]
    assert "empty question" in reasons[1]
    assert "missing question" in reasons[2]
    assert "empty answer" in reasons[3]


@pytest.mark.parametrize("suffix", FORMATS)
def test_bad_rows_error_names_rows(tmp_path: Path, suffix: str) -> None:
    with pytest.raises(DataError) as err:
        read_prompts(_write(BAD_ROWS, tmp_path / f"bad{suffix}"), on_bad_row="error")
    msg = str(err.value)
    assert "4 of 6 rows" in msg
    for row in (1, 3, 4, 5):
        assert f"row {row}:" in msg
    assert "row 0:" not in msg and "row 2:" not in msg
    assert "set data.on_bad_row=skip" in msg  # the override a run takes (before: only the Python argument)


def test_non_string_question_and_bad_types(tmp_path: Path) -> None:
    lines = [
        '{"question": 12, "answer": "1"}',  # row 0: question is a number
        '{"question": "q1", "answer": 42}',  # row 1: numeric answer is accepted as "42"
        '{"question": "q2", "answer": [1, 2]}',  # row 2: list answer
        '["not", "an", "object"]',  # row 3: not an object
    ]
    path = tmp_path / "types.jsonl"
    path.write_text("\n".join(lines) + "\n")
    result = read_prompts(path)
    assert [(p.question, p.answer) for p in result.prompts] == [("q1", "42")]
    assert [b.row for b in result.skipped] == [0, 2, 3]
    assert "must be a string, got int" in result.skipped[0].reason
    assert "got list" in result.skipped[1].reason
    assert "expected a JSON object" in result.skipped[2].reason


def test_verl_bad_rows(tmp_path: Path) -> None:
    rows = [
        {"prompt": [_chat("user", "fine")], "reward_model": {"ground_truth": "1"}},
        {"prompt": [_chat("system", "only system")], "reward_model": {"ground_truth": "1"}},  # row 1
        {"prompt": [_chat("user", "no truth")], "reward_model": {"ground_truth": None}},  # row 2
    ]
    result = read_prompts(_write(rows, tmp_path / "v.parquet"))
    assert [p.question for p in result.prompts] == ["fine"]
    assert result.skipped[0] == BadRow(1, "column 'prompt' has no user message")
    assert result.skipped[1].row == 2 and "reward_model.ground_truth" in result.skipped[1].reason


@pytest.mark.parametrize("suffix", FORMATS)
def test_duplicate_qids(tmp_path: Path, suffix: str) -> None:
    rows = [
        {"qid": "a", "question": "q0", "answer": "0"},
        {"qid": "b", "question": "q1", "answer": "1"},
        {"qid": "a", "question": "q2", "answer": "2"},  # row 2 repeats qid "a" of row 0
    ]
    path = _write(rows, tmp_path / f"dup{suffix}")
    result = read_prompts(path)
    assert [p.qid for p in result.prompts] == ["a", "b"]
    assert result.skipped == (BadRow(2, "duplicate qid 'a' (first seen in row 0)"),)
    with pytest.raises(DataError, match=r"row 2: duplicate qid 'a'"):
        read_prompts(path, on_bad_row="error")


def test_bad_json_line(tmp_path: Path) -> None:
    path = tmp_path / "broken.jsonl"
    path.write_text(
        '{"question": "q0", "answer": "0"}\n'
        '{"question": "q1", "answer": "1"}\n'
        '{"question": "q2", "answer": \n'  # row 2: truncated JSON
        "\n"  # row 3: blank line, no record
        '{"question": "q4", "answer": "4"}\n'
    )
    result = read_prompts(path)
    assert [p.qid for p in result.prompts] == ["broken:0", "broken:1", "broken:4"]
    assert [b.row for b in result.skipped] == [2]
    assert "invalid JSON on line 3" in result.skipped[0].reason
    with pytest.raises(DataError, match=r"1 of 4 rows .* row 2: invalid JSON"):
        read_prompts(path, on_bad_row="error")


def test_error_lists_only_first_rows(tmp_path: Path) -> None:
    rows = [{"question": "q", "answer": None}] * 8 + [{"question": "good", "answer": "1"}]
    with pytest.raises(DataError) as err:
        read_prompts(_write(rows, tmp_path / "many.jsonl"), on_bad_row="error")
    assert "row 4:" in str(err.value) and "row 5:" not in str(err.value)
    assert "and 3 more" in str(err.value)


def test_no_valid_rows_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="no valid prompt.*row 0: missing answer"):
        read_prompts(_write([{"question": "q", "answer": None}], tmp_path / "none.parquet"))
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(DataError, match="no JSON record"):
        read_prompts(empty)


def test_json_array_file(tmp_path: Path) -> None:
    path = tmp_path / "arr.json"
    path.write_text(json.dumps([{"question": "q0", "answer": "0"}, 5, {"question": "q2", "answer": "2"}]))
    result = read_prompts(path)
    assert [p.qid for p in result.prompts] == ["arr:0", "arr:2"]
    assert [b.row for b in result.skipped] == [1]


@pytest.mark.parametrize("suffix", FORMATS)
def test_write_read_round_trip(tmp_path: Path, suffix: str) -> None:
    prompts = [
        Prompt(qid="x-1", question="Ünïcode ∑ 1+2", answer="3", data_source="s"),
        Prompt(qid="x-2", question="line\nbreak", answer="\\frac{1}{2}", data_source="s"),
    ]
    path = write_prompts(prompts, tmp_path / "sub" / f"out{suffix}")
    result = read_prompts(path)
    assert result.prompts == tuple(prompts) and result.skipped == ()


# ------------------------------------------------------------------------- templates


class FakeChatTokenizer:
    """A tokenizer with a chat template: renders `<|role|>content` turns."""

    chat_template = "fake"

    def __init__(self, *, allow_system: bool = True) -> None:
        self.allow_system = allow_system
        self.calls: list[list[dict[str, str]]] = []

    def apply_chat_template(
        self, messages: list[dict[str, str]], *, tokenize: bool, add_generation_prompt: bool
    ) -> str:
        assert tokenize is False and add_generation_prompt is True
        self.calls.append(messages)
        if not self.allow_system and any(m["role"] == "system" for m in messages):
            raise ValueError("System role not supported")
        return "".join(f"<|{m['role']}|>{m['content']}\n" for m in messages) + "<|assistant|>"


def test_plain_and_llama_base_templates() -> None:
    assert render_prompt("12+7", template="plain") == "Q: 12+7\nA: "
    text = render_prompt("What is 2+2?", template="llama-base")
    assert text.startswith("What is 2+2? Let's think step by step")
    assert "\\boxed{}" in text


def test_chat_template_uses_tokenizer() -> None:
    tok = FakeChatTokenizer()
    text = render_prompt("What is 2+2?", template="chat", tokenizer=tok)
    assert tok.calls == [[{"role": "user", "content": tok.calls[0][0]["content"]}]]
    assert tok.calls[0][0]["content"].startswith("What is 2+2?\n") and "\\boxed{}" in text
    assert text.endswith("<|assistant|>")
    with pytest.raises(TemplateError, match="needs a tokenizer with a chat template"):
        render_prompt("q", template="chat")


def test_chat_short_template_puts_one_line_in_the_system_turn() -> None:
    text = render_prompt("0 - 4 =", template="chat-short", tokenizer=FakeChatTokenizer())
    assert text == f"<|system|>{SHORT_SYSTEM_PROMPT}\n<|user|>0 - 4 =\n<|assistant|>"
    assert "\\boxed{}" in SHORT_SYSTEM_PROMPT and len(SHORT_SYSTEM_PROMPT) < len(THINK_SYSTEM_PROMPT) / 4
    folded = render_prompt("0 - 4 =", template="chat-short", tokenizer=FakeChatTokenizer(allow_system=False))
    assert folded == f"<|user|>{SHORT_SYSTEM_PROMPT}\n\n0 - 4 =\n<|assistant|>"
    with pytest.raises(TemplateError, match="needs a tokenizer with a chat template"):
        render_prompt("q", template="chat-short")


def test_think_template_system_prompt_and_fallbacks() -> None:
    assert "<think>" in THINK_SYSTEM_PROMPT and "</think>" in THINK_SYSTEM_PROMPT
    assert "\\boxed{}" in THINK_SYSTEM_PROMPT
    text = render_prompt("Find x.", template="think", tokenizer=FakeChatTokenizer())
    assert text == f"<|system|>{THINK_SYSTEM_PROMPT}\n<|user|>Find x.\n<|assistant|>"
    # a chat template without a system role: the system prompt is folded into the user turn
    folded = render_prompt("Find x.", template="think", tokenizer=FakeChatTokenizer(allow_system=False))
    assert folded == f"<|user|>{THINK_SYSTEM_PROMPT}\n\nFind x.\n<|assistant|>"
    # no chat template at all: a plain frame
    plain = render_prompt("Find x.", template="think")
    assert plain.startswith(f"System: {THINK_SYSTEM_PROMPT}") and plain.endswith(
        "User: Find x.\n\nAssistant: "
    )


def test_chat_template_with_a_real_tokenizer() -> None:
    tokenizers = pytest.importorskip("tokenizers")
    transformers = pytest.importorskip("transformers")
    vocab = {c: i for i, c in enumerate(["[UNK]", *"abcdefghijklmnopqrstuvwxyz0123456789 "])}
    raw = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    tok = transformers.PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="[UNK]")
    tok.chat_template = (
        "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}</{{ m['role'] }}>{% endfor %}"
        "{% if add_generation_prompt %}<assistant>{% endif %}"
    )
    text = render_prompt("1+1", template="think", tokenizer=tok)
    assert text == f"<system>{THINK_SYSTEM_PROMPT}</system><user>1+1</user><assistant>"


def test_reward_mode_and_unknown_template() -> None:
    assert reward_mode("think") == "think"
    assert [reward_mode(t) for t in ("plain", "chat", "chat-short", "llama-base")] == ["boxed"] * 4
    with pytest.raises(TemplateError, match="choose one of plain, chat, chat-short, think, llama-base"):
        render_prompt("q", template="fancy")  # type: ignore[arg-type]
    with pytest.raises(TemplateError, match="unknown template"):
        reward_mode("fancy")  # type: ignore[arg-type]


def test_openr1_parquet_falls_back_to_target_like_jsonl(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [
        {
            "prompt": [{"role": "user", "content": "1+1?"}],
            "target": [{"role": "assistant", "content": "so \\boxed{2}"}],
            "reward_model": {"ground_truth": None},
        }
    ]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "r1.parquet")
    (tmp_path / "r1.jsonl").write_text(__import__("json").dumps(rows[0]) + "\n")
    for name in ("r1.parquet", "r1.jsonl"):
        result = read_prompts(tmp_path / name, layout="openr1")
        assert [p.answer for p in result.prompts] == ["2"], name
