"""Every unknown key of a config file (and of each override) is reported at once, each with its nearest name."""

from __future__ import annotations

import pytest

from exgrpo.core.config import ConfigError
from exgrpo.core.config_files import load_config

TWO_TYPOS = "trainer:\n  stepz: 3\nreplay:\n  rhoo: 0.3\n"


def test_a_file_with_two_unknown_keys_names_both(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(TWO_TYPOS + "samplerz:\n  num: 1\nlearners:\n  stepz: 1\ntrainer_:\n  lr: 1\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert str(err.value).splitlines() == [
        f"config file {str(path)!r}: 5 unknown config keys and sections:",
        "  key trainer.stepz; did you mean 'steps'?",
        "  key replay.rhoo; did you mean 'rho'?",
        "  section 'samplerz'; did you mean 'samplers'?",
        "  key learners.stepz; did you mean trainer.steps?",  # the nearest key of another section
        "  section 'trainer_'; did you mean 'trainer'?",
    ]


def test_a_key_of_another_section_is_named_there(tmp_path):
    with pytest.raises(ConfigError) as err:
        load_config(None, ["trainer.lr=1e-5"])
    assert (
        str(err.value)
        == "override 'trainer.lr=1e-5': unknown config key trainer.lr; did you mean learners.lr?"
    )


def test_the_file_and_every_override_are_all_checked_before_one_error(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(TWO_TYPOS)
    with pytest.raises(ConfigError) as err:
        load_config(path, ["replay.rho=x", "trainer.steps=2", "samplers.numb=2"])
    lines = str(err.value).splitlines()
    assert lines[0].endswith("2 unknown config keys:") and len(lines) == 5
    assert lines[3] == "override 'replay.rho=x': replay.rho must be a number, got 'x'"
    assert lines[4] == "override 'samplers.numb=2': unknown config key samplers.numb; did you mean 'num'?"
