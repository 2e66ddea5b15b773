"""Every numeric setting states what is valid: a range in `BOUNDS` or an entry in `NO_RANGE` (a rule in
`validate`, or "any value"); a new numeric field with neither fails here. The autoscale and preemption settings
are refused at load with the rule they break (before: "valid: no bound", and `autoscale_min=4 autoscale_max=2`
dry-ran as "4..2 samplers", exit 0)."""

from __future__ import annotations

from dataclasses import fields
from typing import Any, get_args, get_type_hints

import pytest

from exgrpo import run
from exgrpo.core.config import Config, ConfigError, from_dict, yaml_key
from exgrpo.core.config_checks import BOUNDS, NO_RANGE, setting


def _numeric(tp: Any) -> bool:
    """int or float, optional or a tuple of them; bool is not a number here."""
    return tp in (int, float) or any(_numeric(a) for a in get_args(tp) if a is not bool)


def numeric_settings() -> list[str]:
    hints, out = get_type_hints(Config), []
    for section in fields(Config):
        cls = hints[section.name]
        for f in fields(cls):
            if _numeric(get_type_hints(cls)[f.name]):
                out.append(f"{yaml_key(section.name)}.{yaml_key(f.name)}")
    return out


def test_every_numeric_setting_states_what_is_valid():
    names = numeric_settings()
    assert "samplers.autoscale_min" in names and "learners.betas" in names and "trainer.seed" in names
    assert "samplers.autoscale" not in names  # a bool
    missing = [n for n in names if n not in BOUNDS and n not in NO_RANGE]
    assert not missing, f"numeric settings with no stated bound: add each to BOUNDS or NO_RANGE: {missing}"


def test_the_tables_name_real_settings_once():
    cfg = Config()
    for key in [*BOUNDS, *NO_RANGE]:
        setting(cfg, key)  # raises KeyError for a setting that does not exist
    assert not set(BOUNDS) & set(NO_RANGE)


@pytest.mark.parametrize(
    "overrides, names",
    [
        (
            {"autoscale_min": 4, "autoscale_max": 2},
            "samplers.autoscale_min=4 must lie in [1, samplers.autoscale_max=2]",
        ),
        ({"autoscale_max": -1}, "samplers.autoscale_max=-1 must be >= 1"),
        ({"autoscale_max": 0}, "samplers.autoscale_max=0 must be >= 1"),
        ({"autoscale_up_wait": 2.5}, "samplers.autoscale_up_wait=2.5 must lie in (0, 1)"),
        ({"autoscale_down_idle": -1}, "samplers.autoscale_down_idle=-1.0 must lie in (0, 1)"),
        ({"autoscale_hysteresis": 0}, "samplers.autoscale_hysteresis=0 must be >= 1"),
        ({"autoscale_cooldown": -3}, "samplers.autoscale_cooldown=-3 must be >= 0"),
        ({"preempt_grace_s": -5}, "samplers.preempt_grace_s=-5.0 must be >= 0"),
        ({"autoscale": True, "num": 9, "autoscale_max": 8}, "samplers.num=9 lies outside"),
        ({"autoscale": True, "num": 1, "autoscale_min": 2}, "samplers.num=1 lies outside"),
    ],
)
def test_autoscale_and_preemption_settings_are_refused_at_load(overrides, names):
    with pytest.raises(ConfigError) as err:
        from_dict({"samplers": overrides})
    assert names in str(err.value)


def test_the_rules_without_a_range():
    with pytest.raises(
        ConfigError, match=r"learners.betas=\[0.9, 1.0\]: AdamW's betas must each lie in \[0, 1\)"
    ):
        from_dict({"learners": {"betas": [0.9, 1.0]}})
    from_dict({"samplers": {"num": 9, "autoscale_max": 8}})  # the range binds only with autoscale on
    from_dict({"samplers": {"autoscale": True, "num": 3, "autoscale_min": 3, "autoscale_max": 3}})


def test_the_cli_exits_2_with_the_rule(capsys):
    code = run.main(
        ["--config", "tiny-cpu", "samplers.autoscale_min=4", "samplers.autoscale_max=2", "--dry-run"]
    )
    assert code == 2
    assert "samplers.autoscale_min=4 must lie in [1, samplers.autoscale_max=2]" in capsys.readouterr().err
