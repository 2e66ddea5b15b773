"""model.max_prompt_len is enforced before any engine sees a prompt, by one rule (data.long_prompts): the start
and --dry-run refuse a data set with longer prompts, naming the rows, or skip them with a count. Before, a
41-token prompt against a limit of 32 trained silently on the HF engine and vLLM cut the response."""

from __future__ import annotations

import json

import pytest

from exgrpo import run
from exgrpo.core.config_files import load_config
from exgrpo.core.records import Prompt
from exgrpo.data.lengths import check_prompt_lengths, prompt_tokens
from exgrpo.data.readers import DataError
from exgrpo.models.resolve import resolve_model

MODEL = "builtin:scratchpad-base"  # shipped with the package: nothing is built


@pytest.fixture(autouse=True)
def _local(monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(resolve_model(MODEL, cache_dir="~/.cache/exgrpo")))


def _prompts() -> list[Prompt]:
    return [
        Prompt(qid="short", question="1+1", answer="2"),
        Prompt(qid="long", question="1+1" + "+0" * 40, answer="2"),
    ]


def test_the_rule_names_the_long_rows_or_skips_them(tokenizer):
    prompts = _prompts()
    n_long = prompt_tokens(prompts[1], template="plain", tokenizer=tokenizer)
    assert n_long > 32 >= prompt_tokens(prompts[0], template="plain", tokenizer=tokenizer)
    with pytest.raises(DataError, match=rf"1 of 2 prompts are longer than model.max_prompt_len=32 tokens \(qid long: {n_long} tokens\)"):  # fmt: skip
        check_prompt_lengths(
            prompts, template="plain", tokenizer=tokenizer, limit=32, policy="error", what="x"
        )
    got = check_prompt_lengths(
        prompts, template="plain", tokenizer=tokenizer, limit=32, policy="skip", what="x"
    )
    assert [p.qid for p in got.kept] == ["short"] and got.long == [("long", n_long)]
    with pytest.raises(DataError, match="every prompt is longer"):
        check_prompt_lengths(
            prompts[1:], template="plain", tokenizer=tokenizer, limit=32, policy="skip", what="x"
        )


def _data(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_text("\n".join(json.dumps({"qid": p.qid, "question": p.question, "answer": p.answer})
                              for p in _prompts()) + "\n")  # fmt: skip
    return path


def test_dry_run_and_start_refuse_long_prompts_before_ray(tmp_path, capsys):
    data = _data(tmp_path)
    args = [f"model.path={MODEL}", "model.template=plain", f"data.train={data}", f"data.eval={data}",
            "model.max_prompt_len=32"]  # fmt: skip
    assert run.main(["--dry-run", *args]) == 2
    err = capsys.readouterr().err
    assert "longer than model.max_prompt_len=32 tokens (qid long:" in err and "data.long_prompts=skip" in err
    assert run.main(["--dry-run", *args, "data.long_prompts=skip"]) == 0
    assert "skipped 1 of 2 (qid long:" in capsys.readouterr().out

    from exgrpo.runtime.recipe import train

    run_dir = tmp_path / "run"
    with pytest.raises(DataError, match="qid long"):  # the start: before Ray, and no run directory left
        train(load_config(None, [*args, f"logging.run_dir={run_dir}"]))
    assert not run_dir.exists()
