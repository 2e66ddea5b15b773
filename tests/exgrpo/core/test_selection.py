"""Replay selection (exgrpo/core/selection.py): bucket weights, capped allocation, the split over shards,
the global draw plan, and the choice of the stored trajectory for slot 0."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import chisquare

from exgrpo.core.records import Group, TrainBatch, Trajectory
from exgrpo.core.selection import (
    allocate,
    bucket_weights,
    draw_plan,
    fill_slots,
    place_picks,
    replay_picks,
    select_trajectory,
    split_over_shards,
)

# -- bucket weights ------------------------------------------------------------------------------


def test_bucket_weights_k8_all_buckets_by_hand():
    # K = 8, mu = 4, sigma = 1: w_k ∝ exp(-(k-4)^2/2)
    #   w_4 = 1, w_3 = w_5 = e^{-1/2} = 0.606531, w_2 = w_6 = e^{-2} = 0.135335,
    #   w_1 = w_7 = e^{-9/2} = 0.011109; Z = 1 + 2(0.606531 + 0.135335 + 0.011109) = 2.505950
    #   -> w_4 = 0.399050, w_3 = 0.242036, w_2 = 0.054006, w_1 = 0.004433
    w = bucket_weights({k: 5 for k in range(1, 8)}, k_rollouts=8)
    assert list(w) == [1, 2, 3, 4, 5, 6, 7]
    expected = {4: 0.399050, 3: 0.242036, 5: 0.242036, 2: 0.054006, 6: 0.054006, 1: 0.004433, 7: 0.004433}
    for k, v in expected.items():
        assert w[k] == pytest.approx(v, abs=1e-6)
    assert sum(w.values()) == pytest.approx(1.0)


def test_bucket_weights_renormalise_over_non_empty_buckets_only():
    # only buckets 3 and 4 non-empty: w_4 = 1 / (1 + e^{-1/2}) = 0.622459, w_3 = 0.377541
    w = bucket_weights({1: 0, 3: 2, 4: 9, 6: 0}, k_rollouts=8)
    assert w == pytest.approx({3: 0.377541, 4: 0.622459}, abs=1e-6)


def test_bucket_weights_custom_mu_sigma_and_uniform():
    # K = 4, mu = 1, sigma = 2: log w = -(k-1)^2/8 = 0, -1/8, -1/2 -> 1, 0.882497, 0.606531;
    # Z = 2.489028 -> 0.401763, 0.354555, 0.243682
    w = bucket_weights({1: 1, 2: 1, 3: 1}, k_rollouts=4, mu=1.0, sigma=2.0)
    assert w == pytest.approx({1: 0.401763, 2: 0.354555, 3: 0.243682}, abs=1e-6)
    assert bucket_weights({1: 1, 5: 3, 6: 0}, k_rollouts=8, uniform=True) == {1: 0.5, 5: 0.5}
    assert bucket_weights({}, k_rollouts=8) == {}
    assert bucket_weights({2: 0}, k_rollouts=8) == {}


def test_bucket_weights_far_bucket_underflows_to_zero_but_stays_normalised():
    # K = 200, mu = 100: w_1 / w_100 = exp(-99^2/2) = e^{-4900.5}, below the smallest double
    w = bucket_weights({1: 3, 100: 1}, k_rollouts=200)
    assert w == {1: 0.0, 100: 1.0}


@pytest.mark.parametrize(
    "kwargs",
    [dict(sizes={0: 1}), dict(sizes={8: 1}), dict(sizes={2: -1}), dict(sizes={2: 1}, sigma=0.0)],
)
def test_bucket_weights_rejects_bad_input(kwargs):
    with pytest.raises(ValueError):
        bucket_weights(kwargs.pop("sizes"), k_rollouts=8, **kwargs)


# -- allocation ----------------------------------------------------------------------------------


def test_allocate_takes_everything_when_n_exceeds_the_pool():
    rng = np.random.default_rng(0)
    sizes = {1: 2, 4: 3, 7: 1}
    w = bucket_weights(sizes, k_rollouts=8)
    assert allocate(w, sizes, 100, rng=rng) == sizes
    assert allocate(w, sizes, 6, rng=rng) == sizes
    assert allocate(w, sizes, 0, rng=rng) == {}


def test_allocate_zero_weight_bucket_only_after_positive_buckets_are_full():
    rng = np.random.default_rng(1)
    for _ in range(50):
        assert allocate({1: 0.0, 2: 1.0}, {1: 5, 2: 3}, 3, rng=rng) == {2: 3}
        assert allocate({1: 0.0, 2: 1.0}, {1: 5, 2: 3}, 5, rng=rng) == {1: 2, 2: 3}


def test_allocate_rejects_missing_or_negative_weights():
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="no weight"):
        allocate({1: 1.0}, {1: 1, 2: 1}, 1, rng=rng)
    with pytest.raises(ValueError):
        allocate({1: -1.0}, {1: 1}, 1, rng=rng)
    with pytest.raises(ValueError):
        allocate({1: 1.0}, {1: 1}, -1, rng=rng)


@settings(max_examples=150, deadline=None)
@given(
    sizes=st.dictionaries(st.integers(1, 7), st.integers(0, 6), max_size=7),
    n=st.integers(0, 40),
    seed=st.integers(0, 2**32 - 1),
    uniform=st.booleans(),
)
def test_allocate_places_min_n_total_within_sizes(sizes, n, seed, uniform):
    w = bucket_weights(sizes, k_rollouts=8, uniform=uniform)
    counts = allocate(w, sizes, n, rng=np.random.default_rng(seed))
    assert sum(counts.values()) == min(n, sum(sizes.values()))
    assert all(0 < c <= sizes[k] for k, c in counts.items())


# -- trajectory selection ------------------------------------------------------------------------


def test_select_trajectory_lowest_entropy():
    def lowest(ents):
        return select_trajectory(ents, mode="lowest_entropy", rng=np.random.default_rng(0))

    assert lowest([0.7, 0.2, 0.5]) == 1
    assert lowest([0.3, 0.1, 0.1]) == 1  # first on ties
    assert lowest([math.nan, 0.9, math.nan, 0.4]) == 3  # NaN never chosen
    assert lowest([math.nan, math.inf]) == 1
    for bad in ([], [math.nan, math.nan]):
        with pytest.raises(ValueError):
            lowest(bad)


def test_select_trajectory_modes():
    rng = np.random.default_rng(0)
    ents = [0.5, math.nan, 0.9, 0.1, 0.9]
    assert select_trajectory(ents, mode="lowest_entropy", rng=rng) == 3
    assert select_trajectory(ents, mode="highest_entropy", rng=rng) == 2  # first on ties
    picks = Counter(select_trajectory(ents, mode="random", rng=rng) for _ in range(2000))
    assert set(picks) == {0, 2, 3, 4}  # NaN never chosen; each of 4 expected ~500 times
    assert min(picks.values()) > 400
    with pytest.raises(ValueError):
        select_trajectory(ents, mode="median", rng=rng)  # type: ignore[arg-type]


# -- split over shards and the global plan -------------------------------------------------------


def test_split_over_shards_is_hypergeometric():
    # bucket 1 holds 2 questions on shard 0 and 6 on shard 1; drawing 2 without replacement from the
    # union of 8: P(shard 0 gets j) = C(2, j) C(6, 2 - j) / C(8, 2) = 15/28, 12/28, 1/28 for j = 0, 1, 2
    rng, draws = np.random.default_rng(0), 4000
    seen = Counter()
    for _ in range(draws):
        a, b = split_over_shards({1: 2}, [{1: 2}, {1: 6}], rng=rng)
        assert a.get(1, 0) + b.get(1, 0) == 2
        seen[a.get(1, 0)] += 1
    expected = [15 / 28 * draws, 12 / 28 * draws, 1 / 28 * draws]
    assert chisquare([seen[0], seen[1], seen[2]], expected).pvalue > 1e-3


def test_split_over_shards_caps_at_the_bucket_total_and_keeps_positive_entries_only():
    rng = np.random.default_rng(0)
    assert split_over_shards({1: 9, 2: 1, 3: 2}, [{1: 2, 2: 0}, {1: 3}], rng=rng) == [{1: 2}, {1: 3}]
    assert split_over_shards({}, [{1: 2}, {}], rng=rng) == [{}, {}]


def test_draw_plan_weights_buckets_globally_not_per_shard():
    # shard 0 holds only bucket 1 (5 questions), shard 1 only bucket 2 (5); K = 4, mu = 2, n = 1.
    # global weights over {1: 5, 2: 5}: w_1 = e^{-1/2} / (1 + e^{-1/2}) = 0.377541, w_2 = 0.622459,
    # so shard 0 serves the draw with probability 0.377541 (per-shard weights would give 1/2)
    rng, draws = np.random.default_rng(1), 4000
    hits = 0
    for _ in range(draws):
        plan = draw_plan([{1: 5}, {2: 5}], 1, k_rollouts=4, rng=rng)
        assert sum(sum(c.values()) for c in plan) == 1
        hits += plan[0] == {1: 1}
    assert chisquare([hits, draws - hits], [0.377541 * draws, 0.622459 * draws]).pvalue > 1e-3


def test_draw_plan_is_uniform_over_a_buckets_union():
    # one bucket split 1 : 3 over two shards; one draw hits each of the 4 questions with 1/4
    rng, draws = np.random.default_rng(2), 4000
    on_first = sum(draw_plan([{2: 1}, {2: 3}], 1, k_rollouts=4, rng=rng)[0].get(2, 0) for _ in range(draws))
    assert chisquare([on_first, draws - on_first], [draws / 4, 3 * draws / 4]).pvalue > 1e-3


def test_draw_plan_edges():
    rng = np.random.default_rng(0)
    assert draw_plan([{}, {}], 4, k_rollouts=4, rng=rng) == [{}, {}]
    assert draw_plan([{1: 3}, {2: 1}], 0, k_rollouts=4, rng=rng) == [{}, {}]
    assert draw_plan([{1: 2, 3: 0}, {2: 1}], 10, k_rollouts=4, rng=rng) == [{1: 2}, {2: 1}]  # everything
    assert draw_plan([{1: 2}, {1: 0}], 1, k_rollouts=4, uniform=True, rng=rng) == [{1: 1}, {}]


@settings(max_examples=150, deadline=None)
@given(
    shards=st.lists(
        st.dictionaries(st.integers(1, 7), st.integers(0, 5), max_size=7), min_size=1, max_size=4
    ),
    n=st.integers(0, 30),
    seed=st.integers(0, 2**32 - 1),
    uniform=st.booleans(),
)
def test_draw_plan_places_min_n_within_every_shards_sizes(shards, n, seed, uniform):
    plan = draw_plan(shards, n, k_rollouts=8, uniform=uniform, rng=np.random.default_rng(seed))
    assert len(plan) == len(shards)
    assert sum(sum(c.values()) for c in plan) == min(n, sum(sum(s.values()) for s in shards))
    for counts, sizes in zip(plan, shards, strict=True):
        assert all(0 < c <= sizes.get(k, 0) for k, c in counts.items())


# -- filling the replay slot ---------------------------------------------------------------------


def _traj(qid, ids, reward=1.0, group_id="old"):
    return Trajectory(qid, tuple(ids), tuple(-0.1 for _ in ids), reward, 0, group_id=group_id)


def _replay_group(qid, rid, n_candidates):
    cands = tuple(_traj(qid, (100 + i,)) for i in range(n_candidates))
    fresh = tuple(_traj(qid, (rid, i), reward=float(i == 0), group_id=f"g{rid}") for i in range(3))
    return Group(qid, (1,), fresh, kind="replay", request_id=rid, group_id=f"g{rid}", candidates=cands)


def _batch(groups, select, **kw):
    return TrainBatch(groups=tuple(groups), version=0, select=select, **kw)


def test_fill_slots_puts_the_chosen_candidate_in_slot_0():
    fresh = Group("f", (1,), tuple(_traj("f", (i,), group_id="g1") for i in range(4)), request_id=1)
    a, b = _replay_group("a", 2, 2), _replay_group("b", 3, 3)
    # flat entropies: a's candidates [0.5, 0.2], b's [0.9, 0.1, 0.4] -> a picks 101, b picks 101
    ent = [0.5, 0.2, 0.9, 0.1, 0.4]
    asked = []
    out, scores, picks = fill_slots(
        _batch([fresh, a, b], "lowest_entropy"), lambda flat: asked.append(flat) or ent
    )
    assert [c.trajectory.response_ids for c in asked[0]] == [(100,), (101,), (100,), (101,), (102,)]
    assert scores == tuple(ent) and picks == (1, 1) and place_picks([fresh, a, b], picks) == out
    assert out[0] is fresh
    for g, src in zip(out[1:], (a, b), strict=True):
        assert g.kind == "replay" and g.candidates == () and g.request_id == src.request_id
        assert len(g.trajectories) == 4 and g.group_size == 4 and g.num_correct == 2  # slot + one fresh
        assert g.trajectories[0].replayed and g.trajectories[0].response_ids == (101,)
        assert g.trajectories[1:] == src.trajectories
    out, _, picks = fill_slots(_batch([a, b], "highest_entropy"), lambda flat: ent)
    assert [g.trajectories[0].response_ids for g in out] == [(100,), (100,)] and picks == (0, 0)
    # a learner rank whose share holds no replay group still scores (nothing): on a multi-rank engine scoring is
    # a collective, and a rank that skipped it left the others waiting in it
    asked.clear()
    assert fill_slots(_batch([fresh], "lowest_entropy"), lambda flat: asked.append(flat) or []) == (
        [fresh],
        (),
        (),
    )
    assert asked == [[]]
    # no select: the groups as they are, nothing scored
    assert fill_slots(_batch([fresh], None), lambda flat: 1 / 0) == ([fresh], (), ())


def test_random_picks_score_only_when_asked_and_depend_on_the_seed_and_request_only():
    groups = [_replay_group(f"q{i}", i, 5) for i in range(12)]
    _, scores, picks = fill_slots(_batch(groups, "random", select_seed=3), lambda flat: 1 / 0)
    assert scores == () and len(picks) == 12 and all(0 <= p < 5 for p in picks)
    assert fill_slots(_batch(groups[4:], "random", select_seed=3), lambda flat: 1 / 0)[2] == picks[4:]
    assert fill_slots(_batch(groups, "random", select_seed=4), lambda flat: 1 / 0)[2] != picks
    _, scores, again = fill_slots(
        _batch(groups, "random", select_seed=3, score_candidates=True), lambda flat: [0.0] * len(flat)
    )
    assert scores == (0.0,) * 60 and again == picks  # scored for the log, picked as before


def test_picks_reject_mismatches():
    a = _replay_group("a", 2, 2)
    with pytest.raises(ValueError, match="entropies"):
        replay_picks([a], [0.1, 0.2, 0.3], mode="lowest_entropy")
    with pytest.raises(ValueError, match="random selection"):
        replay_picks([a], [0.1, 0.2], mode="random")
    with pytest.raises(ValueError, match="no candidate"):
        replay_picks([_replay_group("b", 3, 0)], [], mode="lowest_entropy")
    with pytest.raises(ValueError, match="picks for"):
        place_picks([a], [])
    assert replay_picks([], [], mode="random") == ()
    with pytest.raises(ValueError, match="select="):
        _batch([a], "median")
