"""ShardedReplay: the client of R replay shards (implements `exgrpo.core.roles.Replay`).

Routing is by a stable hash of qid, so a question's statistics live in one shard; question sampling is global
(`exgrpo.core.selection.draw_plan`) at one parallel round trip, re-planning a shortfall over what is left. The client
holds only the shard handles (`invoke=ray_invoke`, or `local_invoke` for tests), so samplers push through it too.
Invariant: a call to a dead or restarting shard is re-sent to the same handle until it succeeds or
`RayInvoke.retry_s` passes, which is safe since every shard verb may be repeated. More: docs/failures.md ("Replay
shard death"); tests: tests/buffers/test_shard.py, tests/integration/test_shard_restart.py.
"""

from __future__ import annotations

import hashlib
import logging
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from buffers.records import push_payloads
from exgrpo.core.records import Group, PulledBatch, ReplayPick, ReplayStats
from exgrpo.core.selection import draw_plan

Call = tuple[Any, str, dict[str, Any]]  # (shard, method name, keyword arguments)
MAX_SAMPLE_ROUNDS = 3
log = logging.getLogger(__name__)


class RayInvoke:
    """Run the calls on Ray actors concurrently and wait for all (one parallel round trip); a call
    whose actor died or is restarting is re-sent until `retry_s` seconds after its first failure."""

    def __init__(self, *, retry_s: float = 120.0, backoff_s: float = 0.2) -> None:
        self.retry_s, self.backoff_s = retry_s, backoff_s
        self.retries = 0  # calls re-sent by this client (copy) so far

    def __call__(self, calls: Sequence[Call]) -> list[Any]:
        import ray
        from ray.exceptions import RayActorError

        def send(i: int) -> Any:
            shard, method, kwargs = calls[i]
            return getattr(shard, method).remote(**kwargs)

        refs = {i: send(i) for i in range(len(calls))}
        out: list[Any] = [None] * len(calls)
        first_failure: dict[int, float] = {}
        while refs:
            for i, ref in list(refs.items()):
                try:
                    out[i] = ray.get(ref)
                    del refs[i]
                except RayActorError as e:
                    t0 = first_failure.setdefault(i, time.monotonic())
                    if time.monotonic() - t0 >= self.retry_s:
                        raise RuntimeError(
                            f"replay shard call {calls[i][1]!r} still failing after "
                            f"{self.retry_s:.0f} s of retries: {e}"
                        ) from e
                    log.warning(
                        "replay shard call %r failed (%s); retrying while Ray restarts the shard",
                        calls[i][1],
                        type(e).__name__,
                    )
                    self.retries += 1
                    time.sleep(self.backoff_s)
                    refs[i] = send(i)
        return out


ray_invoke = RayInvoke()


def local_invoke(calls: Sequence[Call]) -> list[Any]:
    return [getattr(shard, method)(**kwargs) for shard, method, kwargs in calls]


def shard_of(qid: str, num_shards: int) -> int:
    """Stable across processes and runs (unlike Python's salted `hash`)."""
    digest = hashlib.blake2b(qid.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") % num_shards


def merge_stats(parts: Sequence[ReplayStats]) -> ReplayStats:
    sizes: dict[int, int] = {}
    for st in parts:
        for k, c in st.bucket_sizes.items():
            sizes[k] = sizes.get(k, 0) + c
    return ReplayStats(
        bucket_sizes=dict(sorted(sizes.items())),
        active=sum(s.active for s in parts),
        retired=sum(s.retired for s in parts),
        trajectories=sum(s.trajectories for s in parts),
        ready=sum(s.ready for s in parts),
    )


class ShardedReplay:
    def __init__(
        self,
        *,
        shards: Sequence[Any],
        k_rollouts: int,
        mu: float | None = None,
        sigma: float = 1.0,
        uniform: bool = False,
        invoke: Callable[[Sequence[Call]], list[Any]] = ray_invoke,
    ) -> None:
        self.shards = list(shards)
        self.k_rollouts = k_rollouts
        self.mu, self.sigma, self.uniform = mu, sigma, uniform
        self.invoke = invoke
        self._sizes: list[dict[int, int]] | None = None  # per shard, as last reported

    def __getstate__(self) -> dict[str, Any]:  # samplers receive the handles, not the cached sizes
        return {**self.__dict__, "_sizes": None}

    @property
    def num_shards(self) -> int:
        return len(self.shards)

    def _all(self, method: str, **kwargs: Any) -> list[Any]:
        return self.invoke([(s, method, kwargs) for s in self.shards])

    # -- samplers ----------------------------------------------------------------------------------
    def push(self, *, groups: Sequence[Group]) -> None:
        """Route groups to their shards and wait until every shard has recorded them: one call per shard
        for all the groups (a sampler call's). The groups become one Arrow table here and each shard's rows
        the IPC bytes that shard logs as they are (`ReplayShard.push_payload`): the encoding costs the
        sampler, not the shard, and a retry re-sends the same bytes."""
        by_shard: dict[int, list[Group]] = {}
        for g in groups:
            by_shard.setdefault(shard_of(g.qid, self.num_shards), []).append(g)
        payloads = push_payloads(list(by_shard.values()))
        self.invoke(
            [
                (self.shards[i], "push_payload", {"payload": p})
                for i, p in zip(by_shard, payloads, strict=True)
            ]
        )

    # -- driver ------------------------------------------------------------------------------------
    def set_collect(self, *, on: bool) -> None:
        self._all("set_collect", on=on)

    def sample_questions(self, *, n: int, rng: np.random.Generator) -> list[ReplayPick]:
        """Up to n distinct questions drawn with global bucket weights (docs/architecture.md, "The algorithm"), with candidates."""
        if n <= 0:
            return []
        sizes = self._sizes if self._sizes is not None else self._all("bucket_sizes")
        picked: list[list[str]] = [[] for _ in self.shards]
        out: list[ReplayPick] = []
        for _ in range(MAX_SAMPLE_ROUNDS):
            plan = draw_plan(
                sizes,
                n - len(out),
                k_rollouts=self.k_rollouts,
                mu=self.mu,
                sigma=self.sigma,
                uniform=self.uniform,
                rng=rng,
            )
            calls = [
                (i, {"counts": c, "seed": int(rng.integers(2**31)), "exclude": picked[i]})
                for i, c in enumerate(plan)
                if c
            ]
            if not calls:
                break
            results = self.invoke([(self.shards[i], "sample", kw) for i, kw in calls])
            sizes = list(sizes)
            for (i, _), (picks, left) in zip(calls, results, strict=True):
                out += picks
                picked[i] += [p.qid for p in picks]
                sizes[i] = left
            if len(out) >= n:
                break
        return out

    def pull_batch(self, *, request_ids: Sequence[int]) -> PulledBatch:
        """Take the named finished groups from every shard (one parallel round trip).

        Raises if any named request is neither finished nor dropped: the driver pulls only requests
        that the samplers reported done, and a push is acknowledged before that report.
        """
        # one take_id for every attempt: a shard that died after removing the groups hands them out again
        # the shards answer with rows (`ReplayShard.take_rows`): the groups are built here, not in the shards
        taken = self._all("take_rows", request_ids=list(request_ids), take_id=uuid.uuid4().hex)
        parts: list[PulledBatch] = [t.batch() for t in taken]
        groups = sorted((g for p in parts for g in p.groups), key=lambda g: g.request_id)
        dropped = tuple(sorted(r for p in parts for r in p.dropped))
        missing = set(request_ids) - {g.request_id for g in groups} - set(dropped)
        if missing:
            raise RuntimeError(
                f"pull_batch: requests {sorted(missing)} were reported done but no shard holds "
                "their group (a replay shard lost them)"
            )
        self._sizes = [dict(p.stats.bucket_sizes) for p in parts]
        return PulledBatch(groups=tuple(groups), dropped=dropped, stats=merge_stats([p.stats for p in parts]))

    def stats(self) -> ReplayStats:
        parts: list[ReplayStats] = self._all("stats")
        self._sizes = [dict(p.bucket_sizes) for p in parts]
        return merge_stats(parts)

    def retired(self) -> frozenset[str]:
        return frozenset().union(*self._all("retired"))

    def snapshot(self, *, path: str) -> None:
        Path(path).mkdir(parents=True, exist_ok=True)
        self.invoke(
            [
                (s, "snapshot", {"path": str(Path(path) / f"shard-{i}.parquet")})
                for i, s in enumerate(self.shards)
            ]
        )

    def restore(self, *, path: str) -> None:
        files = sorted(Path(path).glob("shard-*.parquet"))
        if len(files) != self.num_shards:
            raise ValueError(
                f"{path} holds {len(files)} replay shards but this run has {self.num_shards}; resume "
                "with the same replay.num_shards (questions are routed by hash(qid) % shards)"
            )
        self.invoke(
            [
                (s, "restore", {"path": str(Path(path) / f"shard-{i}.parquet")})
                for i, s in enumerate(self.shards)
            ]
        )
        self._sizes = None
