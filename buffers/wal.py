"""A replay shard's write-ahead log: the state-changing calls since its last self-snapshot.

Layout of one shard's directory (`<run_dir>/replay-wal/shard-<i>/`):

    snap-<gen>/      the shard's own snapshot of generation `gen` (written as `.snap-<gen>.tmp`,
                     fsync'd, then renamed: a directory of that name is always complete)
    log-<gen>.wal    the calls applied after `snap-<gen>` (generation 0: after the empty start)

A log is a sequence of frames `magic (4 bytes) | crc32 (u32) | length (u64) | payload`, each payload
one Arrow IPC stream (a table whose schema metadata names the call). `append` returns after the
frame is fsync'd. A frame torn by a crash fails its length or crc check: `open` drops it (it was
never acknowledged) and truncates the file there, so later appends follow the last good frame.

A failed append (ENOSPC, EIO) cuts the file back to the end of the last good frame before it raises, so
no later frame lands behind a partial one (which `read_frames` would stop at, dropping every acknowledged
call after it); if even that fails, the log refuses every later append: the shard fails loudly rather than
acknowledging calls it could not make durable.

`open` recovers: newest complete snapshot, then its log's frames, in order. `rotate` (after the
shard has written `snap-<gen+1>`) starts `log-<gen+1>` and deletes the older generation, which keeps
the log bounded by the shard's compaction threshold.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import struct
import zlib
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa

from buffers.records import encode_payload
from exgrpo.core.fileio import fsync_one, fsync_path

MAGIC = b"XWAL"
HEADER = struct.Struct("<4sIQ")


def _free_space(path: Path) -> str:
    try:
        return f"{shutil.disk_usage(path).free / 2**20:.1f} MiB"
    except OSError:
        return "unknown space"


def encode(table: pa.Table) -> bytes:
    """One frame: header and the table's Arrow IPC stream."""
    payload = encode_payload(table)
    return HEADER.pack(MAGIC, zlib.crc32(payload), len(payload)) + payload


def read_frames(path: Path) -> tuple[list[pa.Table], int]:
    """The intact frames of a log and the byte offset where they end (a torn tail is ignored)."""
    data = path.read_bytes() if path.exists() else b""
    tables, pos = [], 0
    while pos + HEADER.size <= len(data):
        magic, crc, length = HEADER.unpack_from(data, pos)
        payload = data[pos + HEADER.size : pos + HEADER.size + length]
        if magic != MAGIC or len(payload) != length or zlib.crc32(payload) != crc:
            break
        tables.append(pa.ipc.open_stream(payload).read_all())
        pos += HEADER.size + length
    return tables, pos


class WriteAheadLog:
    """One shard's log directory; `open` recovers, `append` logs one call durably."""

    def __init__(self, directory: str | Path) -> None:
        self.dir = Path(directory)
        self.gen = 0
        self._file = None
        self.bytes = 0  # size of the current log
        self.appends = 0  # frames appended since the process started
        self.broken: str | None = None  # why appends are refused (a failed append could not be undone)

    def snap_dir(self, gen: int) -> Path:
        return self.dir / f"snap-{gen:06d}"

    def log_path(self, gen: int) -> Path:
        return self.dir / f"log-{gen:06d}.wal"

    def open(self) -> tuple[Path | None, list[pa.Table]]:
        """Recover: (the newest complete snapshot directory or None, the frames logged after it)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        for tmp in self.dir.glob(".snap-*.tmp"):  # a snapshot that never completed
            shutil.rmtree(tmp, ignore_errors=True)
        gens = sorted(int(p.name.split("-")[1]) for p in self.dir.glob("snap-*") if p.is_dir())
        self.gen = gens[-1] if gens else 0
        self._drop_older()
        path = self.log_path(self.gen)
        tables, end = read_frames(path)
        with open(path, "ab") as f:  # cut a torn tail so the next frame follows the last good one
            f.truncate(end)
            os.fsync(f.fileno())
        self._file = open(path, "ab")  # noqa: SIM115 - held open for appends
        self.bytes = end
        fsync_one(self.dir)
        return (self.snap_dir(self.gen) if gens else None), tables

    def append(self, table: pa.Table) -> None:
        """Log one table: `append_payload` of its Arrow IPC stream."""
        self.append_payload(encode_payload(table))

    def append_payload(self, payload: bytes) -> None:
        """Write one frame (an Arrow IPC stream already encoded, e.g. the bytes a push call brought) and fsync
        it: once this returns, a restarted shard replays it.

        On a write or sync failure the file is cut back to the last good frame and the error is raised
        (naming the file and the free space left), so the call is not acknowledged and nothing is lost.
        """
        if self.broken is not None:
            raise OSError(f"write-ahead log {self.log_path(self.gen)} refuses appends: {self.broken}")
        header = HEADER.pack(MAGIC, zlib.crc32(payload), len(payload))
        try:
            self._file.write(header)
            self._file.write(payload)
            self._file.flush()
            os.fdatasync(self._file.fileno())
        except OSError as err:
            self._undo_partial(err)
            raise OSError(
                err.errno,
                f"{err.strerror or err} while appending to {self.log_path(self.gen)} "
                f"({_free_space(self.dir)} free); the call was not logged nor applied",
            ) from err
        self.bytes += HEADER.size + len(payload)
        self.appends += 1

    def _undo_partial(self, err: OSError) -> None:
        """Drop the partial frame of a failed append: truncate to the last good end and sync."""
        path = self.log_path(self.gen)
        with contextlib.suppress(
            OSError
        ):  # flushing the partial bytes may fail again; the truncate drops them
            self._file.close()
        try:
            with open(path, "r+b") as f:
                f.truncate(self.bytes)
                os.fsync(f.fileno())
            self._file = open(path, "ab")  # noqa: SIM115 - held open for appends
        except OSError as undo:
            self.broken = f"a failed append ({err}) could not be cut back ({undo})"

    def rotate(self, write_snapshot: Callable[[Path], None]) -> None:
        """Write snapshot gen+1 with `write_snapshot(tmp_dir)`, start its empty log, drop generation gen."""
        gen = self.gen + 1
        tmp = self.dir / f".snap-{gen:06d}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        write_snapshot(tmp)
        fsync_path(tmp)  # its files, then the directory
        new_log = self.log_path(gen)
        new_log.write_bytes(b"")
        tmp.rename(self.snap_dir(gen))
        fsync_one(self.dir)
        self._file.close()
        self._file = open(new_log, "ab")  # noqa: SIM115
        self.gen, self.bytes = gen, 0
        self._drop_older()

    def _drop_older(self) -> None:
        for p in self.dir.glob("snap-*"):
            if int(p.name.split("-")[1]) < self.gen:
                shutil.rmtree(p, ignore_errors=True)
        for p in self.dir.glob("log-*.wal"):
            if int(p.name.split("-")[1].split(".")[0]) < self.gen:
                p.unlink(missing_ok=True)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
