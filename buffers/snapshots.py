"""A replay shard's files: a checkpoint's `shard-<i>.parquet[.ready|.seen]` and the extra state of the shard's
own snapshot in its log directory (`state.json`, `taken.parquet`). Pure functions over the shard's parts;
`buffers/shard.py` decides when they are written (under its lock, with no call in flight).

- `<path>`: the pool (`ExperiencePool.iter_arrow`, a parquet row group per piece: never a second copy of the
  whole pool in memory), `<path>.ready`: the finished groups' rows (`buffers/records.py`), `<path>.seen`: the
  pushed request ids and whether each retired its question. Each written atomically (`exgrpo/core/fileio.py`).
- `state.json` (collect, the last take's id, dropped ids and stats) and `taken.parquet` (its groups' rows):
  what a retried take gets back after a restart.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Set
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from buffers.experience import ExperiencePool
from buffers.records import GroupRows, Taken, conform
from exgrpo.core.fileio import atomic_write
from exgrpo.core.records import ReplayStats

SUFFIXES = ("", ".ready", ".seen")


def write_files(
    path: str | Path, pool: ExperiencePool, ready: pa.Table, seen: Set[int], retirers: Set[int]
) -> int:
    """Write the three files at `path`; returns the bytes written."""
    ids = sorted(seen)
    seen_table = pa.table(
        {
            "request_id": pa.array(ids, pa.int64()),
            "retired_its_question": pa.array([r in retirers for r in ids], pa.bool_()),
        }
    )

    def write_pool(tmp: Path) -> None:
        with pq.ParquetWriter(tmp, pool.snapshot_schema()) as writer:
            for table in pool.iter_arrow():
                writer.write_table(table)

    written = 0
    for write, target in (
        (write_pool, Path(path)),
        (_writer(ready), Path(f"{path}.ready")),
        (_writer(seen_table), Path(f"{path}.seen")),
    ):
        atomic_write(target, write)
        written += target.stat().st_size
    release_arrow_memory()
    return written


def read_files(
    path: str | Path, *, k_rollouts: int, max_trajectories_per_question: int
) -> tuple[ExperiencePool, GroupRows | None, set[int], set[int]]:
    """The pool, the ready groups' rows (None without a `.ready` file), the pushed ids and the retirers."""
    with pq.ParquetFile(path) as parquet:  # piece by piece: the whole table is never in memory at once
        pieces = (
            pa.Table.from_batches([b], schema=parquet.schema_arrow)
            for b in parquet.iter_batches(batch_size=16384)
        )
        pool = ExperiencePool.from_arrow(
            pieces if parquet.metadata.num_rows else parquet.read(),
            k_rollouts=k_rollouts,
            max_trajectories_per_question=max_trajectories_per_question,
        )
    ready, seen_file = Path(f"{path}.ready"), Path(f"{path}.seen")
    rows = GroupRows(conform(pq.read_table(ready).replace_schema_metadata(None))) if ready.exists() else None
    seen: set[int] = set()
    retirers: set[int] = set()
    if seen_file.exists():
        table = pq.read_table(seen_file).to_pydict()
        seen = set(table["request_id"])
        retirers = {r for r, x in zip(table["request_id"], table["retired_its_question"], strict=True) if x}
    release_arrow_memory()
    return pool, rows, seen, retirers


def link_files(files_of: str | Path, target: Path) -> None:
    """Share the files at `files_of` under `target`: a hard link where the filesystem allows (snapshot files
    are only ever replaced by rename, never rewritten in place, so sharing one is safe), else a copy."""
    for suffix in SUFFIXES:
        src, dst = Path(f"{files_of}{suffix}"), Path(f"{target}{suffix}")
        if src.exists():
            try:
                os.link(src, dst)
            except OSError:
                shutil.copyfile(src, dst)


def write_state(directory: Path, *, collect: bool, last_take: tuple[str, Taken] | None) -> None:
    state: dict[str, Any] = {"collect": collect, "take_id": None}
    if last_take is not None:
        tid, batch = last_take
        state |= {"take_id": tid, "dropped": list(batch.dropped), "stats": batch.stats.__dict__}
        pq.write_table(batch.rows, directory / "taken.parquet")
    (directory / "state.json").write_text(json.dumps(state))


def read_state(directory: Path) -> tuple[bool, tuple[str, Taken] | None]:
    """(collect, the last take) of `write_state`."""
    state = json.loads((directory / "state.json").read_text())
    if state["take_id"] is None:
        return bool(state["collect"]), None
    st = state["stats"]
    stats = ReplayStats(**{**st, "bucket_sizes": {int(k): v for k, v in st["bucket_sizes"].items()}})
    rows = conform(pq.read_table(directory / "taken.parquet"))
    return bool(state["collect"]), (
        state["take_id"],
        Taken(rows=rows, dropped=tuple(state["dropped"]), stats=stats),
    )


def release_arrow_memory() -> None:
    """Hand the Arrow buffers of a snapshot just written or read back to the OS: pyarrow's allocator
    (mimalloc) keeps freed memory cached, which otherwise left a shard's RSS ~60% above its pool's after a
    snapshot or restore."""
    pa.default_memory_pool().release_unused()


def dir_bytes(directory: Path) -> int:
    return sum(f.stat().st_size for f in directory.iterdir() if f.is_file())


def _writer(table: pa.Table) -> Any:
    return lambda tmp: pq.write_table(table, tmp)
