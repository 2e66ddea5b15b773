"""Replay selection, pure (numpy only): which questions to replay and which stored trajectory fills
slot 0 of each replayed group (docs/architecture.md, "The algorithm").

- `bucket_weights`: Gaussian weight over the difficulty bucket k (or uniform), normalised over
  non-empty buckets.
- `allocate`: bucket counts, multinomial with capping and re-drawing of the excess.
- `split_over_shards`: the global bucket counts divided among shards by a multivariate
  hypergeometric draw (exactly uniform without replacement over a bucket's union across shards).
- `fill_slots`: per replayed question, the candidate with the lowest (or highest) mean token entropy, or
  one at random, goes into slot 0 with `replayed=True`, in two halves: `replay_picks` (which index, by
  `select_trajectory`) and `place_picks` (slot 0 from those indices); `replay_candidates` lists what there
  is to score, in the order the scores are read.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

import numpy as np

from exgrpo.core.records import Group, ReplayCandidate, Selection, TrainBatch


def bucket_weights(
    sizes: Mapping[int, int],
    *,
    k_rollouts: int,
    mu: float | None = None,
    sigma: float = 1.0,
    uniform: bool = False,
) -> dict[int, float]:
    """Sampling weight of each non-empty bucket, normalised to sum 1 (empty buckets absent).

    w_k = exp(-(k - mu)^2 / (2 sigma^2)) with mu = K/2 by default and sigma in units of k;
    `uniform=True` gives every non-empty bucket 1/#buckets (the "no question selection" ablation).
    Computed relative to the largest term, so far-away buckets may underflow to exactly 0.
    """
    check_rollouts(k_rollouts)
    if not sigma > 0:
        raise ValueError(f"sigma={sigma} must be > 0")
    if any(n < 0 for n in sizes.values()):
        raise ValueError(f"bucket sizes must be >= 0, got {dict(sizes)}")
    buckets = sorted(k for k, n in sizes.items() if n > 0)
    bad = [k for k in buckets if not 0 < k < k_rollouts]
    if bad:
        raise ValueError(f"buckets {bad} are outside 1..{k_rollouts - 1} (K={k_rollouts})")
    if not buckets:
        return {}
    if uniform:
        return {k: 1.0 / len(buckets) for k in buckets}
    centre = k_rollouts / 2 if mu is None else mu
    log_w = {k: -((k - centre) ** 2) / (2 * sigma**2) for k in buckets}
    top = max(log_w.values())
    w = {k: math.exp(v - top) for k, v in log_w.items()}
    total = sum(w.values())
    return {k: v / total for k, v in w.items()}


def allocate(
    weights: Mapping[int, float], sizes: Mapping[int, int], n: int, *, rng: np.random.Generator
) -> dict[int, int]:
    """How many questions to draw from each bucket: multinomial with capping.

    n <- min(n, total size). Draw bucket counts ~ Multinomial(n, w / sum w); cap each count at its
    bucket's size and re-draw the excess over the buckets not yet full with renormalised weights,
    until all n are placed. A zero-weight bucket receives questions only once every positive-weight
    bucket is full; the rest is then spread uniformly over the buckets with room. Every round fills
    at least one bucket or places everything, so there are at most #buckets rounds.
    Returns the positive counts only, keyed by bucket.
    """
    if n < 0:
        raise ValueError(f"n={n} must be >= 0")
    buckets = sorted(k for k, s in sizes.items() if s > 0)
    missing = [k for k in buckets if k not in weights]
    if missing:
        raise ValueError(f"no weight for non-empty buckets {missing}")
    w = np.array([weights[k] for k in buckets], dtype=np.float64)
    if not np.all(np.isfinite(w) & (w >= 0)):
        raise ValueError(f"weights must be finite and >= 0, got {dict(weights)}")
    cap = np.array([sizes[k] for k in buckets], dtype=np.int64)
    counts = np.zeros_like(cap)
    remaining = min(n, int(cap.sum()))
    while remaining > 0:
        room = counts < cap
        p = np.where(room, w, 0.0)
        if p.sum() <= 0:
            p = room.astype(np.float64)
        counts += rng.multinomial(remaining, p / p.sum())
        excess = np.maximum(counts - cap, 0)
        counts -= excess
        remaining = int(excess.sum())
    return {k: int(c) for k, c in zip(buckets, counts, strict=True) if c > 0}


def select_trajectory(
    entropies: Sequence[float], *, mode: str, rng: np.random.Generator | None = None
) -> int:
    """Pick a candidate: argmin or argmax entropy (first on ties), or uniform at random (needs `rng`);
    NaN entries are never chosen in any mode."""
    values, ok = _valid_entropies(entropies)
    if mode == "lowest_entropy":
        return int(ok[np.argmin(values[ok])])
    if mode == "highest_entropy":
        return int(ok[np.argmax(values[ok])])
    if mode == "random":
        if rng is None:
            raise ValueError("mode='random' needs an rng")
        return int(ok[rng.integers(len(ok))])
    raise ValueError(f"mode={mode!r}; choose lowest_entropy, highest_entropy or random")


def _valid_entropies(entropies: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    values = np.asarray(entropies, dtype=np.float64).reshape(-1)
    if values.size == 0:
        raise ValueError("no candidate entropies to select from")
    ok = np.flatnonzero(~np.isnan(values))
    if ok.size == 0:
        raise ValueError(f"all {values.size} candidate entropies are NaN")
    return values, ok


def check_rollouts(k_rollouts: int) -> None:
    """K >= 2: a group advantage needs two rollouts."""
    if k_rollouts < 2:
        raise ValueError(f"k_rollouts={k_rollouts} must be >= 2")


def split_over_shards(
    counts: Mapping[int, int], per_shard: Sequence[Mapping[int, int]], *, rng: np.random.Generator
) -> list[dict[int, int]]:
    """Divide each bucket's count among shards in proportion to what they hold, without replacement.

    `per_shard[i][k]` is shard i's size of bucket k; the result's entry i maps k -> shard i's share
    (positive entries only). Counts above a bucket's total are capped at the total.
    """
    out: list[dict[int, int]] = [{} for _ in per_shard]
    for k, c in counts.items():
        sizes = [int(s.get(k, 0)) for s in per_shard]
        c = min(int(c), sum(sizes))
        if c <= 0:
            continue
        for i, ci in enumerate(rng.multivariate_hypergeometric(sizes, c)):
            if ci:
                out[i][k] = int(ci)
    return out


def draw_plan(
    per_shard: Sequence[Mapping[int, int]],
    n: int,
    *,
    k_rollouts: int,
    mu: float | None = None,
    sigma: float = 1.0,
    uniform: bool = False,
    rng: np.random.Generator,
) -> list[dict[int, int]]:
    """How many questions each shard draws from each bucket: global weights from the bucket sizes
    summed over shards, `allocate` over them, then `split_over_shards`. Totals min(n, pool size)."""
    total: dict[int, int] = {}
    for sizes in per_shard:
        for k, c in sizes.items():
            total[k] = total.get(k, 0) + int(c)
    total = {k: c for k, c in total.items() if c > 0}
    if n <= 0 or not total:
        return [{} for _ in per_shard]
    weights = bucket_weights(total, k_rollouts=k_rollouts, mu=mu, sigma=sigma, uniform=uniform)
    return split_over_shards(allocate(weights, total, n, rng=rng), per_shard, rng=rng)


def fill_slots(
    batch: TrainBatch, score: Callable[[Sequence[ReplayCandidate]], Sequence[float]]
) -> tuple[list[Group], tuple[float, ...], tuple[int, ...]]:
    """A batch's groups as trained, every scored candidate's entropy and the picks (`replay_picks`): with
    `batch.select`, slot 0 of each replay group is filled by `score` (the learner's entropies of the replay
    candidates, in `replay_candidates` order; called once, and not under "random" unless
    `batch.score_candidates`); without, the groups as they are. What a learner rank does before it trains."""
    if batch.select is None:
        return list(batch.groups), (), ()
    wanted = batch.select != "random" or batch.score_candidates
    flat = replay_candidates(batch.groups)
    # every rank of a learner group scores (its share may be empty): scoring is a collective on some engines
    entropies = tuple(float(e) for e in score(flat)) if wanted else ()
    picks = replay_picks(
        batch.groups, () if batch.select == "random" else entropies, mode=batch.select, seed=batch.select_seed
    )
    return place_picks(batch.groups, picks), entropies, picks


def replay_picks(
    groups: Sequence[Group], entropies: Sequence[float], *, mode: Selection, seed: int = 0
) -> tuple[int, ...]:
    """Which candidate fills slot 0 of each replay group (its index among the group's candidates, replay groups
    in order): the lowest or highest entropy (`entropies`: one per candidate, in `replay_candidates` order), or
    under "random" (no entropies) a uniform draw from an rng seeded by (`seed`, the group's request id), so the
    picks do not depend on how the batch is split over the learners."""
    replay = _replay_groups(groups)
    if mode == "random":
        if entropies:
            raise ValueError(f"{len(entropies)} entropies given for random selection, which reads none")
        return tuple(
            int(np.random.default_rng([seed, g.request_id]).integers(len(g.candidates))) for g in replay
        )
    picks, i = [], 0
    for g in replay:
        picks.append(select_trajectory(entropies[i : i + len(g.candidates)], mode=mode))
        i += len(g.candidates)
    if i != len(entropies):
        raise ValueError(f"{len(entropies)} entropies for {i} candidates")
    return tuple(picks)


def place_picks(groups: Sequence[Group], picks: Sequence[int]) -> list[Group]:
    """Each replay group with candidate `picks[j]` (j-th replay group) in slot 0 (`replayed=True`) and its
    candidates dropped; fresh groups pass through unchanged."""
    replay = _replay_groups(groups)
    if len(picks) != len(replay):
        raise ValueError(f"{len(picks)} picks for {len(replay)} replay groups")
    it = iter(picks)
    out = []
    for g in groups:
        if g.kind != "replay":
            out.append(g)
            continue
        pick = g.candidates[next(it)]
        out.append(replace(g, trajectories=(replace(pick, replayed=True), *g.trajectories), candidates=()))
    return out


def _replay_groups(groups: Sequence[Group]) -> list[Group]:
    replay = [g for g in groups if g.kind == "replay"]
    for g in replay:
        if not g.candidates:
            raise ValueError(f"replay group of request {g.request_id} ({g.qid!r}) carries no candidate")
    return replay


def replay_candidates(groups: Sequence[Group]) -> list[ReplayCandidate]:
    """Every candidate of the replay groups, in group order then candidate order (the order of the scores
    `replay_picks` reads)."""
    return [
        ReplayCandidate(qid=g.qid, prompt_ids=g.prompt_ids, trajectory=c)
        for g in groups
        if g.kind == "replay"
        for c in g.candidates
    ]
