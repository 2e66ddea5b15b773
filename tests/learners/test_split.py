"""`learners.split`: the one batch split and metric combine of the real and the simulated learner groups."""

from __future__ import annotations

import math

import pytest

from exgrpo.core import metric_names as M
from exgrpo.core.records import Group, Trajectory, UpdateResult
from exgrpo.core.selection import place_picks, replay_picks
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
    result = combine_updates([UpdateResult(ranks[0], (0.1, 0.2), (1,)), UpdateResult(ranks[1], (0.3,), (0,))])
    assert result.entropies == (0.1, 0.2, 0.3) and result.metrics == out and result.picks == (1, 0)


def _replay(request_id: int, n: int) -> Group:
    cands = tuple(
        Trajectory(qid="q", response_ids=(c,), logprobs=(-1.0,), reward=1.0, policy_version=0)
        for c in range(n)
    )
    return Group(
        qid="q", prompt_ids=(1,), trajectories=(), kind="replay", candidates=cands, request_id=request_id
    )


def test_random_picks_do_not_depend_on_the_split():
    groups = [_replay(i, 2 + i % 3) for i in range(8)]
    whole = replay_picks(groups, [], mode="random", seed=5)
    for num in (2, 4):
        parts = [replay_picks(s, [], mode="random", seed=5) for s in split_groups(groups, num)]
        assert combine_updates([UpdateResult({}, picks=p) for p in parts]).picks == whole
    assert replay_picks(groups, [], mode="random", seed=5) == whole  # reproducible
    assert [g.trajectories[0].response_ids[0] for g in place_picks(groups, whole)] == list(whole)
    with pytest.raises(ValueError, match="entropies given for random"):
        replay_picks(groups, [0.0], mode="random", seed=5)
