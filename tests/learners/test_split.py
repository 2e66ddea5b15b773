"""`learners.split`: the one batch split and metric combine of the real and the simulated learner groups."""

from __future__ import annotations

import math

import pytest

from exgrpo.core import metric_names as M
from exgrpo.core.records import UpdateResult
from learners.split import combine_metrics, combine_updates, concat, split_candidates, split_groups


def test_split_groups_into_equal_contiguous_slices():
    assert split_groups(list(range(6)), 3) == [[0, 1], [2, 3], [4, 5]]
    assert split_groups(tuple(range(4)), 1) == [(0, 1, 2, 3)]
    with pytest.raises(ValueError, match="cannot be split into whole groups across 4 learners"):
        split_groups(list(range(6)), 4)


def test_split_candidates_in_ceil_chunks_and_back_in_order():
    chunks = split_candidates(list("abcde"), 3)
    assert chunks == [["a", "b"], ["c", "d"], ["e"]]
    assert split_candidates([], 2) == [[], []]
    assert split_candidates(list("ab"), 4) == [["a"], ["b"], [], []]
    assert concat([[1.0, 2.0], [], [3.0]]) == [1.0, 2.0, 3.0]


def test_combine_is_nan_aware_and_sums_tokens():
    ranks = [
        {M.LOSS: 1.0, M.CLIP_FRAC: math.nan, M.RATIO_REPLAY: math.nan, M.LEARNER_TOKENS: 10.0},
        {M.LOSS: 3.0, M.CLIP_FRAC: 0.5, M.RATIO_REPLAY: math.nan, M.LEARNER_TOKENS: 5.0},
    ]
    out = combine_metrics(ranks)
    assert out[M.LOSS] == 2.0 and out[M.CLIP_FRAC] == 0.5 and out[M.LEARNER_TOKENS] == 15.0
    assert math.isnan(out[M.RATIO_REPLAY])  # no rank has a number
    result = combine_updates([UpdateResult(ranks[0], (0.1, 0.2)), UpdateResult(ranks[1], (0.3,))])
    assert result.entropies == (0.1, 0.2, 0.3) and result.metrics == out
