"""What the experience pool holds, compact, and the rows of its snapshot.

`StoredTrajectory`: one stored correct trajectory (int32 token ids and float32 log-probs: 8 bytes per
token instead of ~60 for tuples of Python numbers); `QuestionState`: a question's prompt, statistical
bucket and stored trajectories; `SortedQids`: a bucket's sampleable questions kept in qid order, so a
draw never depends on the order pushes arrived in. `SNAPSHOT_SCHEMA` and `SnapshotRow`: the table
`buffers.experience.ExperiencePool.to_arrow` writes and `from_arrow` reads. Pure: numpy + pyarrow.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa

from exgrpo.core.records import Trajectory

SNAPSHOT_FORMAT = "exgrpo.experience_pool/1"  # schema metadata of to_arrow() tables


@dataclass(frozen=True, slots=True, eq=False)
class StoredTrajectory:
    """One stored correct trajectory, compact."""

    response_ids: np.ndarray  # (T,) int32
    logprobs: np.ndarray  # (T,) float32
    reward: float
    policy_version: int
    text: str
    group_id: str

    def fields(self) -> dict[str, Any]:
        return {f: getattr(self, f) for f in self.__slots__}

    def key(self) -> tuple:
        return tuple(v.tobytes() if isinstance(v, np.ndarray) else v for v in self.fields().values())

    def to_trajectory(self, qid: str) -> Trajectory:
        ids, lps = tuple(self.response_ids.tolist()), tuple(self.logprobs.tolist())
        return Trajectory(
            qid, ids, lps, self.reward, self.policy_version, text=self.text, group_id=self.group_id
        )


class QuestionState:
    """One tracked question: its prompt, its statistical bucket, its stored trajectories, where it is indexed."""

    __slots__ = ("bucket", "indexed", "prompt_ids", "stored")

    def __init__(self, prompt_ids: np.ndarray, bucket: int | None = None) -> None:
        self.prompt_ids = prompt_ids  # (P,) int32
        self.bucket = bucket  # statistical bucket 1..K-1, None before any 0 < k < K
        self.stored: list[StoredTrajectory] = []  # oldest first
        self.indexed: int | None = None  # the bucket index holding it (sampleable), else None


class SortedQids:
    """Members kept sorted by qid: O(log n) search plus one memmove to add or remove, O(n) uniform draws.

    Sorted, not insertion-ordered, so a draw depends only on which questions a bucket holds, never on the
    order in which concurrent samplers' pushes arrived (a run with eta = 0 repeats its draws with any
    number of samplers)."""

    __slots__ = ("items", "members")

    def __init__(self) -> None:
        self.items: list[str] = []
        self.members: set[str] = set()

    def __len__(self) -> int:
        return len(self.items)

    def __contains__(self, qid: str) -> bool:
        return qid in self.members

    def add(self, qid: str) -> None:
        bisect.insort(self.items, qid)
        self.members.add(qid)

    def remove(self, qid: str) -> None:
        del self.items[bisect.bisect_left(self.items, qid)]
        self.members.remove(qid)


class SnapshotRow(NamedTuple):
    """One snapshot row; fields in SNAPSHOT_SCHEMA order."""

    row: str
    qid: str
    bucket: int | None = None
    prompt_ids: np.ndarray | None = None
    response_ids: np.ndarray | None = None
    logprobs: np.ndarray | None = None
    reward: float | None = None
    policy_version: int | None = None
    text: str | None = None
    group_id: str | None = None


SNAPSHOT_SCHEMA = pa.schema(
    [
        ("row", pa.string()),  # "question" | "trajectory" | "retired"
        ("qid", pa.string()),
        ("bucket", pa.int16()),  # question rows: statistical bucket (null: none yet)
        ("prompt_ids", pa.list_(pa.int32())),  # question rows
        ("response_ids", pa.list_(pa.int32())),  # trajectory rows, (T,)
        ("logprobs", pa.list_(pa.float32())),  # trajectory rows, (T,) behaviour log-probs
        ("reward", pa.float64()),  # trajectory rows
        ("policy_version", pa.int64()),  # trajectory rows
        ("text", pa.string()),  # trajectory rows
        ("group_id", pa.string()),  # trajectory rows
    ]
)


def compact(t: Trajectory) -> StoredTrajectory:
    """A trajectory in the pool's compact form (int32 ids, float32 log-probs)."""
    ids, lps = np.asarray(t.response_ids, dtype=np.int32), np.asarray(t.logprobs, dtype=np.float32)
    return StoredTrajectory(ids, lps, float(t.reward), int(t.policy_version), t.text, t.group_id)
