"""ShardedReplay: the client of R replay shard actors.

Routing is by a stable hash of qid, so a question's statistics live in one shard. Question
sampling is global: bucket weights come from bucket sizes summed over shards, the per-bucket
counts are split across shards by a multivariate hypergeometric draw (exactly uniform sampling
without replacement over the union of a bucket), and each shard serves its share.

The client holds only actor handles, so it can be passed to samplers (which push groups) and
used by the driver (which samples questions and pulls batches).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np
import ray

from buffers.experience import allocate, bucket_weights
from buffers.shard import ShardStats
from exgrpo.types import Group


def shard_of(qid: str, num_shards: int) -> int:
    """Stable across processes and runs (unlike Python's salted `hash`)."""
    digest = hashlib.blake2b(qid.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") % num_shards


class ShardedReplay:
    def __init__(
        self,
        *,
        shards: Sequence,
        k_rollouts: int,
        mu: float | None = None,
        sigma: float = 1.0,
        uniform: bool = False,
    ) -> None:
        self.shards = list(shards)
        self.k_rollouts = k_rollouts
        self.mu, self.sigma, self.uniform = mu, sigma, uniform

    @property
    def num_shards(self) -> int:
        return len(self.shards)

    def push(self, *, groups: Sequence[Group]) -> None:
        """Route groups to their shards and wait until every shard has recorded them."""
        by_shard: dict[int, list[Group]] = {}
        for g in groups:
            by_shard.setdefault(shard_of(g.qid, self.num_shards), []).append(g)
        ray.get([self.shards[i].push.remote(groups=gs) for i, gs in by_shard.items()])

    def set_collect(self, *, on: bool) -> None:
        ray.get([s.set_collect.remote(on=on) for s in self.shards])

    def size(self) -> int:
        """Sampleable questions over all shards."""
        return sum(sum(s.values()) for s in ray.get([s.bucket_sizes.remote() for s in self.shards]))

    def sample_questions(self, n: int, *, rng: np.random.Generator) -> list[str]:
        """n distinct questions drawn with global Gaussian bucket weights (DESIGN.md 4)."""
        per_shard: list[dict[int, int]] = ray.get([s.bucket_sizes.remote() for s in self.shards])
        sizes: dict[int, int] = {}
        for shard_sizes in per_shard:
            for k, c in shard_sizes.items():
                sizes[k] = sizes.get(k, 0) + c
        if n <= 0 or not sizes:
            return []
        weights = bucket_weights(
            sizes, k_rollouts=self.k_rollouts, mu=self.mu, sigma=self.sigma, uniform=self.uniform
        )
        counts = allocate(weights, sizes, n, rng=rng)
        shard_counts: list[dict[int, int]] = [{} for _ in self.shards]
        for k, c in counts.items():
            if c == 0:
                continue
            split = rng.multivariate_hypergeometric([s.get(k, 0) for s in per_shard], c)
            for i, ci in enumerate(split):
                if ci:
                    shard_counts[i][k] = int(ci)
        refs = [
            self.shards[i].sample_from_buckets.remote(counts=c, seed=int(rng.integers(2**31)))
            for i, c in enumerate(shard_counts)
            if c
        ]
        return [q for qids in ray.get(refs) for q in qids]

    def pull_batch(self, *, n_fresh: int, n_replay: int) -> list[Group]:
        """The oldest n_fresh finished fresh groups and n_replay finished replay groups.

        Oldest means lowest request id, i.e. issue order, so a step's batch is exactly the groups
        admitted for it once they have all finished. Raises if fewer are finished.
        """
        entries = ray.get([s.ready.remote() for s in self.shards])
        fresh = sorted((e.request_id, i) for i, es in enumerate(entries) for e in es if e.kind == "fresh")
        replay = sorted((e.request_id, i) for i, es in enumerate(entries) for e in es if e.kind == "replay")
        if len(fresh) < n_fresh or len(replay) < n_replay:
            raise RuntimeError(
                f"pull_batch asked for {n_fresh} fresh + {n_replay} replay groups but only "
                f"{len(fresh)} + {len(replay)} are finished"
            )
        chosen = fresh[:n_fresh] + replay[:n_replay]
        wanted: dict[int, list[int]] = {}
        for rid, i in chosen:
            wanted.setdefault(i, []).append(rid)
        groups = [
            g
            for gs in ray.get([self.shards[i].take.remote(request_ids=r) for i, r in wanted.items()])
            for g in gs
        ]
        return sorted(groups, key=lambda g: g.request_id)

    def ready_count(self) -> tuple[int, int]:
        entries = ray.get([s.ready.remote() for s in self.shards])
        fresh = sum(e.kind == "fresh" for es in entries for e in es)
        return fresh, sum(len(es) for es in entries) - fresh

    def retired(self) -> frozenset[str]:
        return frozenset().union(*ray.get([s.retired.remote() for s in self.shards]))

    def stats(self) -> ShardStats:
        all_stats: list[ShardStats] = ray.get([s.stats.remote() for s in self.shards])
        sizes: dict[int, int] = {}
        for st in all_stats:
            for k, c in st.bucket_sizes.items():
                sizes[k] = sizes.get(k, 0) + c
        return ShardStats(
            bucket_sizes=dict(sorted(sizes.items())),
            active=sum(s.active for s in all_stats),
            retired=sum(s.retired for s in all_stats),
            trajectories=sum(s.trajectories for s in all_stats),
            ready=sum(s.ready for s in all_stats),
        )
