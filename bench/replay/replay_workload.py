"""The workload of `bench/replay/bench_replay_scale.py`: stand-in samplers (`Pusher`) and a replay shard that counts
its calls and can profile itself (`instrumented_shard`). Kept apart so the script stays readable; both work
against the `buffers/` of any tree on `sys.path` (the script's --baseline runs an older commit's too).
"""

from __future__ import annotations

import cProfile
import io
import os
import pstats
import threading
import time
from typing import Any

import numpy as np

K = 8
PROMPT_LEN = 128


class Pusher:
    """A stand-in sampler: builds groups for its qids and pushes them through its copy of the client."""

    def __init__(self, *, replay, seed: int, min_len: int, max_len: int, bank: int = 2048) -> None:
        rng = np.random.default_rng(seed)
        self.replay = replay
        self.rng = rng
        lengths = rng.integers(min_len, max_len + 1, size=bank)
        self.bank = [
            (
                tuple(rng.integers(0, 50_000, n).tolist()),
                tuple(np.log(rng.uniform(0.05, 1.0, n)).astype(np.float32).astype(float).tolist()),
            )
            for n in lengths
        ]
        self.prompt = tuple(rng.integers(0, 50_000, PROMPT_LEN).tolist())

    def pid(self) -> int:
        return os.getpid()

    def group(self, q: int):
        from exgrpo.core.records import Group, Trajectory

        r = self.rng.random()
        k = K if r < 0.02 else 0 if r < 0.05 else int(self.rng.integers(1, K))  # 2% retire, 3% k=0
        picks = self.rng.choice(len(self.bank), size=K, replace=False)
        qid, gid = f"q{q:07d}", f"r{q}"
        trajs = tuple(
            Trajectory(
                qid=qid,
                response_ids=self.bank[j][0],
                logprobs=self.bank[j][1],
                reward=float(i < k),
                policy_version=q // 10_000,
                group_id=gid,
            )
            for i, j in enumerate(picks)
        )
        return Group(
            qid=qid,
            prompt_ids=self.prompt,
            trajectories=trajs,
            gold="42",
            group_id=gid,
            request_id=q,
            policy_version=q // 10_000,
        )

    def run(
        self, *, qids: list[int], push_batch: int, take_every: int, floor: bool = False
    ) -> dict[str, float]:
        """Push `qids`' groups `push_batch` per call and pull them back every `take_every`. With `floor`, the
        shards are `NullShard`s: the pushes are the same calls with the same bytes, the takes the same calls
        per shard, and nothing comes back."""
        push_s = take_s = 0.0
        pending: list[int] = []
        t_all = time.perf_counter()
        for start in range(0, len(qids), push_batch):
            groups = [self.group(q) for q in qids[start : start + push_batch]]
            t0 = time.perf_counter()
            self.replay.push(groups=groups)
            push_s += time.perf_counter() - t0
            pending += [g.request_id for g in groups]
            if len(pending) >= take_every or start + push_batch >= len(qids):
                t0 = time.perf_counter()
                if floor:
                    self.replay.invoke(
                        [
                            (s, "take_rows", {"request_ids": pending, "take_id": None})
                            for s in self.replay.shards
                        ]
                    )
                else:
                    self.replay.pull_batch(request_ids=pending)
                take_s += time.perf_counter() - t0
                pending = []
        return {
            "groups": len(qids),
            "push_s": push_s,
            "take_s": take_s,
            "wall_s": time.perf_counter() - t_all,
        }


class NullShard:
    """The transport floor: a shard that answers `push_payload` and `take_rows` without doing anything, so a run
    against it costs what Ray and the clients cost (building, encoding and sending the same calls) and nothing a
    shard does."""

    def ping(self) -> str:
        return "pong"

    def pid(self) -> int:
        return os.getpid()

    def push_payload(self, *, payload: bytes) -> int:
        return 0

    def take_rows(self, *, request_ids: list[int], take_id: str | None = None) -> None:
        return None


def instrumented_shard() -> type:
    """`buffers.shard.ReplayShard` plus `counters()` (push calls received, log frames made durable, fdatasync
    calls) and `profile(on=)`: a cProfile of the push and take verbs by CPU time (`time.thread_time`, one
    profiler per thread the actor serves calls on, merged), so the time a thread waits for the disk or for
    the lock is not counted. Whatever the process spends outside those verbs (Ray's task handling, argument
    and result (de)serialisation) is the rest of its CPU time."""
    from buffers.shard import ReplayShard

    class BenchShard(ReplayShard):
        push_calls = 0
        _profiling = False

        def counters(self) -> dict[str, int]:
            wal = self.wal
            frames = wal.appends if wal else 0
            return {"push_calls": self.push_calls, "frames": frames, "syncs": getattr(wal, "syncs", frames)}

        def profile(self, *, on: bool, top: int = 16) -> str:
            if on:
                self._profiles: dict[int, cProfile.Profile] = {}
                self._profiling = True
                return ""
            self._profiling = False
            out = io.StringIO()
            stats = pstats.Stats(*self._profiles.values(), stream=out)
            stats.sort_stats("tottime").print_stats(top)
            total = stats.total_tt  # type: ignore[attr-defined]
            return (
                f"CPU in the push and take verbs: {total:.2f} s ({len(self._profiles)} threads)\n"
                + out.getvalue()
            )

    def instrumented(verb: Any, *, push: bool) -> Any:
        def run(self: Any, **kwargs: Any) -> Any:
            self.push_calls += push
            if not self._profiling:
                return verb(self, **kwargs)
            prof = self._profiles.setdefault(threading.get_ident(), cProfile.Profile(time.thread_time))
            return prof.runcall(verb, self, **kwargs)

        return run

    for name in ("push", "push_payload", "take", "take_rows"):  # the verbs a client of either tree calls
        if hasattr(ReplayShard, name):
            setattr(BenchShard, name, instrumented(getattr(ReplayShard, name), push=name.startswith("push")))
    return BenchShard
