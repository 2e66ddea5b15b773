"""Tests of the pure experience pool: statistics, buckets, sampling (through `draw_plan`), snapshots.

The weights, allocation and trajectory selection themselves are tested in tests/exgrpo/core/test_selection.py."""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Sequence
from itertools import product

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import chisquare

from buffers.experience import ExperiencePool
from exgrpo.core.records import Group, Trajectory
from exgrpo.core.selection import bucket_weights, draw_plan

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


def sample(pool: ExperiencePool, n: int, *, rng: np.random.Generator) -> list[str]:
    """The one sampling path: global plan over (here) one shard, then the pool's draw inside buckets."""
    plan = draw_plan([pool.bucket_sizes()], n, k_rollouts=pool.k_rollouts, rng=rng)[0]
    return pool.sample_from_buckets(plan, rng=rng)


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


def test_a_pool_that_never_retires_only_takes_a_solved_question_out_of_its_bucket():
    pool = ExperiencePool(4, retire=False)  # the on-policy baseline's shards (replay.retire)
    pool.record(fresh("a", 2), collect=True)
    pool.record(fresh("a", 4, start=10), collect=True)  # k = K: not retired, not sampleable
    assert not pool.is_retired("a") and pool.retired() == frozenset() and pool.num_retired() == 0
    assert pool.bucket_of("a") is None and len(pool) == 0 and pool.num_trajectories() == 2
    pool.record(fresh("a", 1, start=20), collect=True)  # a later group puts it back in bucket k
    assert pool.bucket_of("a") == 1 and pool.bucket_sizes() == {1: 1}
    pool.record(fresh("b", 4), collect=True)  # a question first seen solved K/K
    assert not pool.is_retired("b") and pool.bucket_of("b") is None


def test_statistics_without_collection_make_no_sampleable_question():
    pool = ExperiencePool(4)
    pool.record(fresh("a", 2), collect=False)  # before replay starts: stats only
    assert pool.bucket_of("a") == 2 and pool.prompt_ids("a") == (7, 8, 9)
    assert len(pool) == 0 and pool.bucket_sizes() == {} and pool.num_trajectories() == 0
    assert sample(pool, 5, rng=np.random.default_rng(0)) == []
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
            got = sample(pool, n, rng=np.random.default_rng(seed))
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


def test_sample_from_buckets_draws_exact_counts_and_gives_what_a_bucket_has():
    pool = ExperiencePool(4)
    for i in range(3):
        pool.record(fresh(f"one{i}", 1), collect=True)
    pool.record(fresh("two", 2), collect=True)
    rng = np.random.default_rng(0)
    got = pool.sample_from_buckets({1: 2, 2: 1, 3: 0}, rng=rng)  # ascending k: two from bucket 1, then "two"
    assert len(got) == 3 and got[2] == "two" and set(got[:2]) < {"one0", "one1", "one2"}
    # regression (race): counts planned from stale sizes; a bucket gives what it has, never raises
    assert pool.sample_from_buckets({2: 2}, rng=rng) == ["two"]
    assert pool.sample_from_buckets({3: 1}, rng=rng) == []
    assert sorted(pool.sample_from_buckets({1: 5, 2: 9, 3: 4}, rng=rng)) == ["one0", "one1", "one2", "two"]
    with pytest.raises(ValueError):
        pool.sample_from_buckets({1: -1}, rng=rng)


def test_sample_from_buckets_after_a_push_moved_or_retired_a_question():
    # the plan {1: 3, 2: 1} is made from sizes {1: 3, 2: 1}; then pushes land before the draw:
    # one0 moves to bucket 3 and one1 is retired (K/K) -> bucket 1 holds only one2, bucket 2 "two"
    pool = ExperiencePool(4)
    for i in range(3):
        pool.record(fresh(f"one{i}", 1), collect=True)
    pool.record(fresh("two", 2), collect=True)
    plan = draw_plan([pool.bucket_sizes()], 4, k_rollouts=4, rng=np.random.default_rng(0))[0]
    assert plan == {1: 3, 2: 1}  # n = pool size: everything is planned
    pool.record(fresh("one0", 3, start=10), collect=True)
    pool.record(fresh("one1", 4, start=20), collect=True)
    got = pool.sample_from_buckets(plan, rng=np.random.default_rng(1))
    assert got == ["one2", "two"]
    assert pool.sample_from_buckets(
        {1: 1, 3: 1}, rng=np.random.default_rng(2), exclude=frozenset({"one2"})
    ) == ["one0"]
    assert pool.bucket_sizes(exclude=frozenset({"one2", "one1"})) == {2: 1, 3: 1}


def test_sample_from_buckets_exclude_is_uniform_over_the_rest():
    # bucket 1 holds a..e; excluding a and b, each of c, d, e is drawn (1 of 3) with probability 1/3
    pool = ExperiencePool(4)
    for q in "abcde":
        pool.record(fresh(q, 1), collect=True)
    rng, draws = np.random.default_rng(3), 3000
    seen = Counter(
        q for _ in range(draws) for q in pool.sample_from_buckets({1: 1}, rng=rng, exclude=frozenset("ab"))
    )
    assert set(seen) == set("cde")
    assert chisquare([seen[q] for q in "cde"], [draws / 3] * 3).pvalue > 1e-3


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
    seen = Counter(pool.bucket_of(q) for _ in range(draws) for q in sample(pool, 1, rng=rng))
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
        got = Counter(pool.bucket_of(q) for q in sample(pool, n, rng=rng))
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
    pool = ExperiencePool(4, cap)
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
    back = ExperiencePool.from_arrow(table, k_rollouts=4, max_trajectories_per_question=3)
    assert back == pool
    assert back.retired() == pool.retired() and back.bucket_sizes() == pool.bucket_sizes()
    for qid in [f"q{i}" for i in range(12)] + ["stats-only"]:
        assert back.bucket_of(qid) == pool.bucket_of(qid)
        assert back.candidates(qid) == pool.candidates(qid)  # same trajectories in the same order
    assert back.prompt_ids("stats-only") == (7, 8, 9)
    # same bucket-index order: the same RNG state draws the same questions
    assert sample(back, 4, rng=np.random.default_rng(3)) == sample(pool, 4, rng=np.random.default_rng(3))
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


def test_iter_arrow_pieces_are_to_arrow_and_load_back_piece_by_piece():
    pool = busy_pool()
    for size in (1, 2, 1000):
        pieces = list(pool.iter_arrow(questions_per_table=size))
        assert all(p.schema.equals(pool.snapshot_schema(), check_metadata=True) for p in pieces)
        assert pa.concat_tables(pieces).equals(pool.to_arrow())
        assert ExperiencePool.from_arrow(iter(pieces), k_rollouts=4, max_trajectories_per_question=3) == pool
    empty = ExperiencePool(8)
    assert [p.num_rows for p in empty.iter_arrow()] == [0]
