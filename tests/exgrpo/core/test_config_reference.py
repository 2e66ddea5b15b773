"""The settings reference (docs/config.md, `--help-config`) is generated from the code and stays current."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import get_args, get_type_hints

import pytest

from exgrpo import run
from exgrpo.core import config_reference
from exgrpo.core.config import BOUNDS, Config, ConfigError, setting
from exgrpo.core.config_files import load_config
from exgrpo.core.config_reference import (
    REGENERATE,
    field_comments,
    markdown,
    plain_text,
    sections,
    undocumented,
)


def test_docs_config_md_is_current():
    """The CI check: a field, comment, default or bound changed without regenerating docs/config.md."""
    current = config_reference.DOC.read_text(encoding="utf-8")
    assert current == markdown(), f"docs/config.md is stale; regenerate it with: {REGENERATE}"


def test_every_setting_is_in_the_reference_with_a_doc_comment():
    found = sections()
    assert undocumented(found) == []
    expected = [
        f"{f.name.rstrip('_')}.{sub.name}"
        for f in fields(Config)
        for sub in fields(get_type_hints(Config)[f.name])
    ]
    assert [s.key for rows in found.values() for s in rows] == expected
    text = markdown()
    assert all(f"| `{key}` |" in text for key in expected)


@dataclass(frozen=True)
class _Example:
    # the comment above,
    # on two lines
    above: int = 1
    trailing: int = 1  # a trailing comment
    bare: float = 0.5

    # the block right above a field, after a blank line
    after_blank: int = 2


def test_field_comments_reads_the_block_above_and_a_trailing_one_and_finds_a_missing_one():
    assert field_comments(_Example) == {
        "above": "the comment above, on two lines",
        "trailing": "a trailing comment",
        "bare": "",
        "after_blank": "the block right above a field, after a blank line",
    }


def test_a_field_without_a_comment_stops_the_reference(monkeypatch):
    real = config_reference.field_comments

    def without_rho(cls):
        return {k: ("" if k == "rho" else v) for k, v in real(cls).items()}

    monkeypatch.setattr(config_reference, "field_comments", without_rho)
    assert undocumented(sections()) == ["replay.rho"]
    with pytest.raises(ValueError, match="settings without a doc comment: replay.rho"):
        markdown()


def _row(key):
    return next(s for rows in sections().values() for s in rows if s.key == key)


def test_types_defaults_and_ranges_come_from_the_code():
    rho = _row("replay.rho")
    assert (rho.type, rho.valid) == ("float", "[0, 1]")
    assert rho.meaning == "share of each batch's questions drawn from replay"
    assert _row("samplers.engine").valid == "hf, vllm"
    assert _row("replay.enabled").valid == "true, false"
    assert (_row("replay.max_age").type, _row("replay.max_age").valid) == ("int or null", ">= 0, or null")
    assert _row("replay.mu").valid == "(0, trainer.rollouts_per_question), or null"
    assert _row("loss.entropy_coef").valid == "any value (< 0 rewards lower entropy)"  # NO_RANGE
    assert _row("samplers.autoscale_min").valid == "[1, samplers.autoscale_max]"
    assert _row("logging.backends").valid == "any of jsonl, tensorboard, wandb"
    # the default shown is what a run starts from (the packaged default.yaml); the code's own one, where it
    # differs, is listed once at the end (markdown) or once per section (--help-config)
    steps = _row("trainer.steps")
    assert (steps.default, steps.code_default) == (str(load_config().trainer.steps), "20")
    text = markdown()
    assert "| `trainer.steps` | int | `100` | >= 1 |" in text and "(code:" not in text
    assert text.split("## `Config()` in Python", 1)[1].count("| `trainer.steps` | `100` | `20` |") == 1
    help_text = plain_text("trainer")
    assert "trainer.steps: int = 100; valid" in help_text and "(code:" not in help_text
    assert "a Config() built in Python without that file has trainer.steps=20," in " ".join(help_text.split())


def test_the_header_lists_the_shipped_configs_and_the_override_syntax():
    text = markdown()
    for name in ("default", "tiny-cpu", "qwen2.5-math-7b"):
        assert f"`configs/{name}.yaml`, `exgrpo/configs/{name}.yaml`" in text
    assert "`section.key=value`" in text and "logging.backends=[tensorboard,wandb]" in text


def test_every_bound_names_a_numeric_setting():
    cfg = load_config()
    hints = {
        f"{f.name.rstrip('_')}.{sub}": tp
        for f in fields(Config)
        for sub, tp in get_type_hints(get_type_hints(Config)[f.name]).items()
    }
    for key, bound in BOUNDS.items():
        assert key in hints, key
        assert {int, float} & {hints[key], *get_args(hints[key])}, key
        for end in (bound.lo, bound.hi):
            if isinstance(end, str):
                assert isinstance(setting(cfg, end), int | float), (key, end)


def _just_outside(cfg, key):
    """A value just outside each end of the setting's bound (the end itself where it is open)."""
    section, name = key.split(".")
    tp = get_type_hints(get_type_hints(Config)[f"{section}_" if section == "async" else section])[name]
    kind = int if int in (tp, *get_args(tp)) else float
    bound = BOUNDS[key]
    for end, sign, is_open in ((bound.lo, -1, bound.open_lo), (bound.hi, 1, bound.open_hi)):
        if end is not None:
            value = setting(cfg, end) if isinstance(end, str) else end
            yield kind(value if is_open else value + sign * (1 if kind is int else 0.5))


@pytest.mark.parametrize("key", sorted(BOUNDS))
def test_validate_checks_every_declared_bound(key):
    cfg = load_config()
    outside = list(_just_outside(cfg, key))
    assert outside
    for bad in outside:
        with pytest.raises(ConfigError, match=f"{key}={bad} must") as err:
            load_config(None, [f"{key}={bad}"])
        assert BOUNDS[key].text(lambda k: setting(cfg, k)) in str(err.value)


def test_check_and_write(tmp_path, monkeypatch, capsys):
    assert config_reference.main(["--check"]) == 0
    doc = tmp_path / "config.md"
    monkeypatch.setattr(config_reference, "DOC", doc)
    doc.write_text("# old\n")
    assert config_reference.main(["--check"]) == 1
    assert REGENERATE in capsys.readouterr().err
    assert config_reference.main(["--write"]) == 0
    assert doc.read_text() == markdown() and config_reference.main(["--check"]) == 0


def test_help_config_prints_all_or_one_section(capsys):
    assert run.main(["--help-config"]) == 0
    everything = capsys.readouterr().out
    assert "replay.rho: float = 0.5; valid: [0, 1]" in everything and "trainer.steps" in everything
    assert run.main(["--help-config", "replay"]) == 0
    one = capsys.readouterr().out
    assert one.startswith("replay\n") and "replay.mu" in one and "trainer.steps" not in one
    assert "      share of each batch's questions drawn from replay" in one
    assert run.main(["--help-config", "replya"]) == 2
    assert "unknown config section 'replya'; did you mean 'replay'?" in capsys.readouterr().err
