"""Tests of the pure experience pool: statistics, buckets, sampling, snapshots, selection."""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Sequence
from itertools import product

import numpy as np
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import chisquare

from buffers.experience import (
    ExperiencePool,
    allocate,
    bucket_weights,
    select_lowest_entropy,
    select_trajectory,
)
from exgrpo.types import Group, Trajectory

E = math.exp


def traj(
    qid: str, ids: Sequence[int], correct: bool, *, replayed: bool = False, version: int = 0
) -> Trajectory:
    # log-probs exactly representable in float32 (the pool stores float32)
    return Trajectory(qid, tuple(ids), tuple(-0.5 * (i % 4) for i in range(len(ids))), float(correct),
                      version, replayed=replayed, text=f"r{ids}", group_id=f"g{version}")  # fmt: skip


def group(qid: str, outcomes: Sequence[tuple[Sequence[int], bool]], *, kind: str = "fresh",
          replayed: Sequence[int] | None = None, version: int = 0) -> Group:  # fmt: skip
    """outcomes: (response ids, correct) per fresh rollout; `replayed`: ids of a filled slot 0."""
    ts = [traj(qid, ids, ok, version=version) for ids, ok in outcomes]
    if replayed is not None:
        ts.insert(0, traj(qid, replayed, True, replayed=True, version=version))
    return Group(qid, (7, 8, 9), tuple(ts), kind=kind, policy_version=version)  # type: ignore[arg-type]


def fresh(qid: str, k: int, K: int = 4, *, start: int = 0, version: int = 0) -> Group:
    """K rollouts of which the first k are correct, with distinct ids start, start+1, ..."""
    return group(qid, [((start + i,), i < k) for i in range(K)], version=version)


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


# -- the pool: statistics and storage ------------------------------------------------------------


def test_record_moves_buckets_keeps_on_zero_and_retires_on_all_correct():
    pool = ExperiencePool(4)
    pool.record(fresh("a", 1), collect=True)
    assert pool.bucket_of("a") == 1 and pool.bucket_sizes() == {1: 1} and len(pool) == 1
    pool.record(fresh("a", 3, start=10), collect=True)  # latest k wins
    assert pool.bucket_of("a") == 3 and pool.bucket_sizes() == {3: 1}
    assert pool.num_trajectories() == 1 + 3
    pool.record(fresh("a", 0, start=20), collect=True)  # k = 0: nothing changes
    assert pool.bucket_of("a") == 3 and pool.num_trajectories() == 4
    assert [t.response_ids for t in pool.candidates("a")] == [(0,), (10,), (11,), (12,)]
    pool.record(fresh("a", 4, start=30), collect=True)  # k = K: retired at once
    assert pool.is_retired("a") and pool.retired() == frozenset({"a"})
    assert pool.bucket_of("a") is None and pool.candidates("a") == [] and len(pool) == 0
    assert pool.num_trajectories() == 0 and pool.bucket_sizes() == {}
    pool.record(fresh("a", 2, start=40), collect=True)  # a retired question is ignored
    assert pool.is_retired("a") and len(pool) == 0 and pool.num_trajectories() == 0
    with pytest.raises(KeyError):
        pool.prompt_ids("a")


def test_statistics_without_collection_make_no_sampleable_question():
    pool = ExperiencePool(4)
    pool.record(fresh("a", 2), collect=False)  # before replay starts: stats only
    assert pool.bucket_of("a") == 2 and pool.prompt_ids("a") == (7, 8, 9)
    assert len(pool) == 0 and pool.bucket_sizes() == {} and pool.num_trajectories() == 0
    assert pool.sample_questions(5, rng=np.random.default_rng(0)) == []
    pool.record(fresh("a", 1), collect=True)
    assert pool.bucket_sizes() == {1: 1}


def test_replay_groups_count_the_slot_and_never_store_the_replayed_trajectory():
    pool = ExperiencePool(4)
    pool.record(fresh("a", 1), collect=True)  # stores (0,)
    # scheduled replay group: K-1 = 3 fresh rollouts, 1 correct, + the replay slot -> k = 2
    g = group("a", [((5,), True), ((6,), False), ((7,), False)], kind="replay")
    assert (g.num_correct, g.group_size) == (2, 4)
    pool.record(g, collect=True)
    assert pool.bucket_of("a") == 2 and [t.response_ids for t in pool.candidates("a")] == [(0,), (5,)]
    # mixed group with slot 0 filled: the replayed trajectory is not stored again
    g = group("a", [((8,), True), ((9,), False), ((5,), True)], kind="replay", replayed=(99,))
    pool.record(g, collect=True)
    assert pool.bucket_of("a") == 3 and [t.response_ids for t in pool.candidates("a")] == [(0,), (5,), (8,)]
    # replay slot + 3 correct fresh rollouts = K: retired
    pool.record(group("a", [((1,), True)] * 3, kind="replay"), collect=True)
    assert pool.is_retired("a")


def test_group_size_must_match_k():
    pool = ExperiencePool(8)
    with pytest.raises(ValueError, match="K=8"):
        pool.record(fresh("a", 2, K=4), collect=True)


def test_dedup_by_token_ids_and_cap_evicts_oldest():
    pool = ExperiencePool(4, max_trajectories_per_question=3)
    pool.record(
        group("a", [((1, 2), True), ((1, 2), True), ((3,), False), ((4,), False)], version=0), collect=True
    )
    assert [t.response_ids for t in pool.candidates("a")] == [(1, 2)]  # duplicate within a group
    pool.record(
        group("a", [((1, 2), True), ((5,), True), ((6,), True), ((0,), False)], version=1), collect=True
    )
    # (1, 2) already stored (first copy kept, version 0); (5,), (6,) appended
    cands = pool.candidates("a")
    assert [(t.response_ids, t.policy_version) for t in cands] == [((1, 2), 0), ((5,), 1), ((6,), 1)]
    pool.record(
        group("a", [((7,), True), ((0,), False), ((0,), False), ((0,), False)], version=2), collect=True
    )
    assert [t.response_ids for t in pool.candidates("a")] == [(5,), (6,), (7,)]  # (1, 2) evicted
    assert pool.num_trajectories() == 3
    pool.record(
        group("a", [((1, 2), True), ((0,), False), ((0,), False), ((0,), False)], version=3), collect=True
    )
    assert [t.response_ids for t in pool.candidates("a")] == [(6,), (7,), (1, 2)]  # evicted ids may return


def test_candidates_round_trip_the_trajectory_fields():
    pool = ExperiencePool(4)
    g = group("a", [((3, 1, 4), True), ((1,), False), ((5,), False), ((9,), False)], version=6)
    pool.record(g, collect=True)
    (c,) = pool.candidates("a")
    assert c == g.trajectories[0]  # float32-exact log-probs come back equal, replayed=False


# -- the pool: model-based property test ---------------------------------------------------------

K_PROP, CAP_PROP = 4, 2
IDS = [(1,), (2,), (1, 2), (3, 3, 3)]
record_op = st.tuples(
    st.just("record"),
    st.sampled_from(["a", "b", "c", "d", "e"]),
    st.sampled_from(["fresh", "replay", "mixed"]),
    st.lists(st.tuples(st.sampled_from(IDS), st.booleans()), min_size=K_PROP, max_size=K_PROP),
    st.booleans(),
)
sample_op = st.tuples(st.just("sample"), st.integers(0, 7), st.integers(0, 2**32 - 1))


@settings(max_examples=200, deadline=None)
@given(ops=st.lists(st.one_of(record_op, record_op, sample_op), max_size=40))
def test_pool_matches_a_reference_model(ops):
    pool = ExperiencePool(K_PROP, CAP_PROP)
    bucket: dict[str, int] = {}
    stored: dict[str, list[tuple[int, ...]]] = defaultdict(list)
    retired: set[str] = set()
    for op in ops:
        if op[0] == "record":
            _, qid, kind, outcomes, collect = op
            if kind == "fresh":
                g, fresh_outcomes, k = group(qid, outcomes), outcomes, sum(ok for _, ok in outcomes)
            elif kind == "replay":  # K-1 fresh + the slot (counts as correct)
                fresh_outcomes = outcomes[1:]
                g, k = group(qid, fresh_outcomes, kind="replay"), 1 + sum(ok for _, ok in fresh_outcomes)
            else:  # slot 0 filled with a replayed trajectory (ids (42,), never stored)
                fresh_outcomes = outcomes[1:]
                g = group(qid, fresh_outcomes, kind="replay", replayed=(42,))
                k = 1 + sum(ok for _, ok in fresh_outcomes)
            pool.record(g, collect=collect)
            if qid in retired:
                pass
            elif k == K_PROP:
                retired.add(qid)
                bucket.pop(qid, None)
                stored.pop(qid, None)
            elif k > 0:
                bucket[qid] = k
                for ids, ok in fresh_outcomes if collect else []:
                    if ok and ids not in stored[qid]:
                        stored[qid] = (stored[qid] + [ids])[-CAP_PROP:]
        else:
            _, n, seed = op
            sampleable = {q for q in bucket if stored.get(q)}
            got = pool.sample_questions(n, rng=np.random.default_rng(seed))
            assert len(got) == len(set(got)) == min(n, len(sampleable))  # distinct, at most n / available
            assert set(got) <= sampleable and not set(got) & retired
        sampleable = {q for q in bucket if stored.get(q)}
        assert pool.retired() == retired and len(pool) == len(sampleable)
        assert pool.bucket_sizes() == dict(Counter(bucket[q] for q in sampleable))
        assert pool.num_trajectories() == sum(len(v) for v in stored.values())
        for qid in "abcde":
            assert pool.bucket_of(qid) == bucket.get(qid)
            assert [t.response_ids for t in pool.candidates(qid)] == stored.get(qid, [])


# -- sampling ------------------------------------------------------------------------------------


def test_sample_from_buckets_draws_exact_counts_and_rejects_too_many():
    pool = ExperiencePool(4)
    for i in range(3):
        pool.record(fresh(f"one{i}", 1), collect=True)
    pool.record(fresh("two", 2), collect=True)
    rng = np.random.default_rng(0)
    got = pool.sample_from_buckets({1: 2, 2: 1, 3: 0}, rng=rng)
    assert len(got) == 3 and got[2] == "two" and set(got[:2]) < {"one0", "one1", "one2"}
    with pytest.raises(ValueError, match="bucket 2 of size 1"):
        pool.sample_from_buckets({2: 2}, rng=rng)
    with pytest.raises(ValueError, match="bucket 3 of size 0"):
        pool.sample_from_buckets({3: 1}, rng=rng)


def test_sample_questions_one_matches_bucket_weights():
    # K = 8 with every bucket non-empty; one question per draw, so no capping:
    # P(bucket k) = w_k exactly (0.004433 for k = 1, 7 -> ~27 of 6000 expected; chi-square is fine)
    pool = ExperiencePool(8)
    sizes = {1: 3, 2: 1, 3: 2, 4: 5, 5: 1, 6: 4, 7: 2}
    for k, s in sizes.items():
        for i in range(s):
            pool.record(fresh(f"q{k}-{i}", k, K=8), collect=True)
    assert pool.bucket_sizes() == sizes
    rng, draws = np.random.default_rng(1234), 6000
    seen = Counter(pool.bucket_of(q) for _ in range(draws) for q in pool.sample_questions(1, rng=rng))
    w = bucket_weights(sizes, k_rollouts=8)
    observed = [seen[k] for k in sizes]
    expected = [w[k] * draws for k in sizes]
    assert chisquare(observed, expected).pvalue > 1e-3


def exact_allocation_pmf(weights: dict[int, float], sizes: dict[int, int], n: int) -> dict[tuple, float]:
    """Exact distribution of the per-bucket counts of the capped multinomial procedure, by
    enumerating every multinomial outcome of every round (independent of the implementation)."""
    buckets = sorted(sizes)
    out: dict[tuple, float] = defaultdict(float)

    def rounds(counts: list[int], remaining: int, prob: float) -> None:
        if remaining == 0:
            out[tuple(counts)] += prob
            return
        room = [i for i, b in enumerate(buckets) if counts[i] < sizes[b]]
        total = sum(weights[buckets[i]] for i in room)
        for draw in product(range(remaining + 1), repeat=len(room)):
            if sum(draw) != remaining:
                continue
            p = math.factorial(remaining)
            for i, d in zip(room, draw, strict=True):
                p *= (weights[buckets[i]] / total) ** d / math.factorial(d)
            new, excess = list(counts), 0
            for i, d in zip(room, draw, strict=True):
                over = max(new[i] + d - sizes[buckets[i]], 0)
                new[i] += d - over
                excess += over
            rounds(new, excess, prob * p)

    rounds([0] * len(buckets), min(n, sum(sizes.values())), 1.0)
    return dict(out)


def composition_frequencies(sizes: dict[int, int], n: int, draws: int, seed: int, K: int = 4) -> Counter:
    pool = ExperiencePool(K)
    for k, s in sizes.items():
        for i in range(s):
            pool.record(fresh(f"q{k}-{i}", k, K=K), collect=True)
    rng, seen = np.random.default_rng(seed), Counter()
    for _ in range(draws):
        got = Counter(pool.bucket_of(q) for q in pool.sample_questions(n, rng=rng))
        seen[tuple(got[k] for k in sorted(sizes))] += 1
    return seen


def test_capped_bucket_redistributes_its_excess_exactly():
    # K = 4, mu = 2: w_2 = 1 / (1 + 2 e^{-1/2}) = 0.451863 (the favourite, but it holds 1 question),
    # w_1 = w_3 = e^{-1/2} / (1 + 2 e^{-1/2}) = 0.274069; n = 3.
    sizes, n = {1: 6, 2: 1, 3: 6}, 3
    w = bucket_weights(sizes, k_rollouts=4)
    p1, p2 = w[1], w[2]
    pmf = exact_allocation_pmf(w, sizes, n)
    # by hand: bucket 2 is empty only if no draw hits it: (1 - p2)^3 = (2 p1)^3 = 0.164690
    assert sum(v for c, v in pmf.items() if c[1] == 0) == pytest.approx(0.164690, abs=1e-6)
    # (1,1,1): direct 6 p1^2 p2; or 2 hits on bucket 2 and 1 elsewhere (3 p1 p2^2 per side), the
    # excess going to the other outer bucket with prob 1/2; or 3 hits, the 2 excess splitting 1-1
    # with prob 1/2: 6 p1^2 p2 + 3 p1 p2^2 + p2^3 / 2 = 0.203647 + 0.167880 + 0.046132 = 0.417659
    assert pmf[(1, 1, 1)] == pytest.approx(6 * p1**2 * p2 + 3 * p1 * p2**2 + p2**3 / 2)
    assert pmf[(1, 1, 1)] == pytest.approx(0.417659, abs=1e-5)
    assert sum(pmf.values()) == pytest.approx(1.0) and max(c[1] for c in pmf) == 1
    draws = 4000
    seen = composition_frequencies(sizes, n, draws, seed=7)
    assert set(seen) <= set(pmf)
    keys = sorted(pmf)
    assert chisquare([seen[c] for c in keys], [pmf[c] * draws for c in keys]).pvalue > 1e-3


def test_two_levels_of_capping_match_exact_enumeration():
    # K = 8: w_4 : w_3 : w_6 = 1 : e^{-1/2} : e^{-2} = 1 : 0.607 : 0.135. Bucket 4 (1 question) and
    # bucket 3 (2 questions) both overflow often when n = 6 of 11; the excess of bucket 4 goes to
    # buckets 3 and 6 in the renormalised ratio 0.818 : 0.182 (not 1 : 1), then bucket 3's to 6.
    sizes, n, draws = {3: 2, 4: 1, 6: 8}, 6, 4000
    pmf = exact_allocation_pmf(bucket_weights(sizes, k_rollouts=8), sizes, n)
    assert sum(pmf.values()) == pytest.approx(1.0)
    seen = composition_frequencies(sizes, n, draws, seed=11, K=8)
    assert set(seen) <= set(pmf)
    big = sorted(c for c, p in pmf.items() if p * draws >= 5)  # pool the rare outcomes in one bin
    rare = [c for c in pmf if c not in big]
    observed = [seen[c] for c in big] + [sum(seen[c] for c in rare)]
    expected = [pmf[c] * draws for c in big] + [sum(pmf[c] for c in rare) * draws]
    assert chisquare(observed, expected).pvalue > 1e-3


# -- snapshots -----------------------------------------------------------------------------------


def busy_pool(cap: int = 3) -> ExperiencePool:
    pool = ExperiencePool(4, cap, sigma=1.5)
    rng = np.random.default_rng(5)
    for step in range(60):
        qid = f"q{rng.integers(12)}"
        outcomes = [(tuple(rng.integers(0, 50, size=rng.integers(1, 6)).tolist()), bool(rng.random() < 0.55))
                    for _ in range(4)]  # fmt: skip
        pool.record(group(qid, outcomes, version=step), collect=step >= 5)
    pool.record(fresh("stats-only", 2), collect=False)
    return pool


def test_parquet_round_trip_restores_an_equal_pool(tmp_path):
    pool = busy_pool()
    assert pool.retired() and len(pool) >= 3 and pool.num_trajectories() > len(pool)
    path = tmp_path / "pool.parquet"
    pq.write_table(pool.to_arrow(), path)
    table = pq.read_table(path)
    assert str(table.schema.field("response_ids").type) == "list<element: int32>"
    assert str(table.schema.field("logprobs").type) == "list<element: float>"
    back = ExperiencePool.from_arrow(table, k_rollouts=4, max_trajectories_per_question=3, sigma=1.5)
    assert back == pool
    assert back.retired() == pool.retired() and back.bucket_sizes() == pool.bucket_sizes()
    for qid in [f"q{i}" for i in range(12)] + ["stats-only"]:
        assert back.bucket_of(qid) == pool.bucket_of(qid)
        assert back.candidates(qid) == pool.candidates(qid)  # same trajectories in the same order
    assert back.prompt_ids("stats-only") == (7, 8, 9)
    # same bucket-index order: the same RNG state draws the same questions
    assert back.sample_questions(4, rng=np.random.default_rng(3)) == pool.sample_questions(
        4, rng=np.random.default_rng(3)
    )
    pool.record(fresh("new", 1), collect=True)
    assert back != pool


def test_round_trip_of_an_empty_pool_and_bad_snapshots():
    empty = ExperiencePool(8)
    assert ExperiencePool.from_arrow(empty.to_arrow(), k_rollouts=8) == empty
    with pytest.raises(ValueError, match="K=4"):
        ExperiencePool.from_arrow(busy_pool().to_arrow(), k_rollouts=8)


def test_loading_with_a_smaller_cap_keeps_the_newest():
    pool = busy_pool(cap=3)
    small = ExperiencePool.from_arrow(pool.to_arrow(), k_rollouts=4, max_trajectories_per_question=1)
    for qid in [f"q{i}" for i in range(12)]:
        assert small.candidates(qid) == pool.candidates(qid)[-1:]


# -- trajectory selection ------------------------------------------------------------------------


def test_select_lowest_entropy():
    assert select_lowest_entropy([0.7, 0.2, 0.5]) == 1
    assert select_lowest_entropy([0.3, 0.1, 0.1]) == 1  # first on ties
    assert select_lowest_entropy([math.nan, 0.9, math.nan, 0.4]) == 3  # NaN never chosen
    assert select_lowest_entropy([math.nan, math.inf]) == 1
    for bad in ([], [math.nan, math.nan]):
        with pytest.raises(ValueError):
            select_lowest_entropy(bad)


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
