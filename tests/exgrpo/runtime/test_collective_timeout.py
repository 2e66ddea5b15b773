"""The learner group's collective timeout (NCCL's watchdog) is derived from the weight bound, or set by hand."""

from __future__ import annotations

import pytest

from exgrpo.core.config import ConfigError, from_dict
from exgrpo.core.config_files import load_config
from exgrpo.runtime.longest_call import collective_timeout_s


def test_it_outlasts_rank_0s_two_weight_bounds_and_never_drops_below_torchs_default():
    # the 7B recipe: 3000 s to open a world and 3000 s to send, the other ranks waiting in a collective
    assert collective_timeout_s(load_config("qwen2.5-math-7b", [])) == 2 * 3000 + 120
    assert collective_timeout_s(from_dict({"async": {"weight_timeout_s": 60}})) == 600  # torch's default
    assert collective_timeout_s(from_dict({"learners": {"collective_timeout_s": 30}})) == 30


def test_a_non_positive_timeout_is_refused_at_load():
    with pytest.raises(ConfigError, match="learners.collective_timeout_s"):
        from_dict({"learners": {"collective_timeout_s": 0}})
    with pytest.raises(ConfigError, match="on_collective_failure"):
        from_dict({"async": {"on_collective_failure": "retry"}})
