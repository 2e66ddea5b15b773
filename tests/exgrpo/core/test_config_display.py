"""`--print-config` of a run started with `train(reward_fn=...)`: the reward by its name, read without running
anything the pickle holds (exgrpo.core.config_display)."""

from __future__ import annotations

import dataclasses
import json

from exgrpo.core.config_display import packed_name, shown_text, shown_yaml
from exgrpo.core.config_files import load_config
from exgrpo.verify.closure import combine, pack


def exact_match(prompt: str, completion: str, fields: dict) -> float:
    return float(fields["answer"] in completion)


def make(threshold: int):
    def length_bonus(prompt: str, completion: str, fields: dict) -> float:
        return float(len(completion) < threshold)

    return length_bonus


class Loud:
    """A callable object whose unpickling would run its own code."""

    def __setstate__(self, state: dict) -> None:
        raise AssertionError("the reader ran the pickle's code")

    def __call__(self, prompt: str, completion: str, fields: dict) -> float:
        return 1.0


def test_a_packed_reward_is_named_by_module_and_qualified_name():
    here = __name__
    assert packed_name(pack(exact_match)) == f"{here}:exact_match (in-memory)"
    assert packed_name(pack(make(3))) == f"{here}:make.<locals>.length_bonus (in-memory)"
    weighted = pack(combine([(exact_match, 1.0), (make(200), 0.5)]))
    assert (
        packed_name(weighted) == f"{here}:exact_match + 0.5 * {here}:make.<locals>.length_bonus (in-memory)"
    )
    assert packed_name(pack(json.dumps)) == "json:dumps (in-memory)"  # an installed function, by reference
    loud = Loud()
    loud.level = 2  # a state to restore: the unpickler would call __setstate__
    assert packed_name(pack(loud)) == f"{here}:Loud (in-memory)"
    assert packed_name("cloudpickle:AAAA") == "a Python callable (16-character cloudpickle spec)"


def test_print_config_shows_the_name_and_config_yaml_keeps_the_spec(tmp_path, capsys):
    from exgrpo.run import main

    cfg = load_config("tiny-cpu", ())
    spec = pack(make(200))
    cfg = dataclasses.replace(cfg, reward=dataclasses.replace(cfg.reward, fn=spec))
    (tmp_path / "config.yaml").write_text(cfg.to_yaml())
    assert main(["--resume", str(tmp_path), "--print-config"]) == 0
    out = capsys.readouterr().out
    assert "cloudpickle:" not in out and "fn: " + f"{__name__}:make.<locals>.length_bonus (in-memory)" in out
    assert f"({len(spec)} characters of cloudpickle)" in out
    assert (
        shown_yaml(load_config("tiny-cpu", ())) == load_config("tiny-cpu", ()).to_yaml()
    )  # others unchanged


def test_report_html_shows_the_name_too():
    from exgrpo.reporting.report import report_html, summary

    cfg = load_config("tiny-cpu", ())
    packed = dataclasses.replace(cfg, reward=dataclasses.replace(cfg.reward, fn=pack(exact_match)))
    page = report_html(summary([], [], 1.0), {}, run_id="r", config_yaml=packed.to_yaml())
    assert "cloudpickle:" not in page and f"fn: {__name__}:exact_match (in-memory)" in page
    assert shown_text(cfg.to_yaml()) == cfg.to_yaml() and shown_text("[unparsed") == "[unparsed"
