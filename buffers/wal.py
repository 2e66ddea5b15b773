"""A replay shard's write-ahead log: the state-changing calls since its last self-snapshot.

One shard's directory holds `snap-<gen>/` (written under a temporary name, so always complete) and `log-<gen>.wal`,
frames of `magic | crc32 | length | Arrow IPC payload`. Invariants: `append` returns once its frame is fsync'd; a
frame torn by a crash is dropped at `open` (it was never acknowledged); a failed append cuts the file back to its
last good frame, or else refuses every later append; `rotate` keeps the log bounded. More: docs/failures.md
("Replay shard death", "I/O faults in the log"); tests: tests/buffers/test_wal.py.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import struct
import threading
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

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


class Ticket:
    """A frame written to the log: `done` once its sync ended, with `error` if that sync failed."""

    __slots__ = ("done", "error")

    def __init__(self) -> None:
        self.done = False
        self.error: OSError | None = None


class WriteAheadLog:
    """One shard's log directory; `open` recovers, `append` logs one call durably."""

    def __init__(self, directory: str | Path, *, lock: Any = None) -> None:
        """`lock` guards the file and its offsets (default: its own); a shard passes its own lock, so a failed
        sync fails its frames atomically with respect to the shard's calls."""
        self.dir = Path(directory)
        self.gen = 0
        self._file: BinaryIO | None = None  # the current log, open for appends (`open`)
        self.bytes = 0  # size of the current log (the end of the frames written)
        self.durable = 0  # the end of the frames fdatasync'd
        self.appends = 0  # frames made durable since the process started
        self.syncs = 0  # fdatasync calls that made them so (fewer under group commit)
        self._unsynced: list[Ticket] = []  # frames written, not yet synced, in file order
        self._last: Ticket | None = None  # the last frame written (synced or not)
        self._lock = lock if lock is not None else threading.RLock()  # the file, its offsets and _unsynced
        self._sync_lock = threading.Lock()  # one sync at a time (the leader's)
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
        self.bytes = self.durable = end
        fsync_one(self.dir)
        return (self.snap_dir(self.gen) if gens else None), tables

    def append(self, table: pa.Table) -> None:
        """Log one table: `append_payload` of its Arrow IPC stream."""
        self.append_payload(encode_payload(table))

    def append_payload(self, payload: bytes) -> None:
        """Write one frame (an Arrow IPC stream already encoded, e.g. the bytes a push call brought) and fsync
        it: once this returns, a restarted shard replays it. `sync(write(payload))`."""
        self.sync(self.write(payload))

    @property
    def _out(self) -> BinaryIO:
        if self._file is None:
            raise RuntimeError(f"the write-ahead log in {self.dir} is not open (open() opens it)")
        return self._file

    def write(self, payload: bytes) -> Ticket:
        """Write one frame, not yet durable; `sync(ticket)` makes it so. Frames follow each other in the order
        of these calls (the shard makes them under its lock, in the order it applies the calls).

        On a write failure the file is cut back to the end of the frame before (frames written but not yet
        synced stay) and the error is raised, naming the file and the free space left."""
        with self._lock:
            if self.broken is not None:
                raise OSError(f"write-ahead log {self.log_path(self.gen)} refuses appends: {self.broken}")
            header = HEADER.pack(MAGIC, zlib.crc32(payload), len(payload))
            try:
                self._out.write(header)
                self._out.write(payload)
                self._out.flush()
            except OSError as err:
                self._undo_partial(err, self.bytes)
                raise self._failure(err) from err
            self.bytes += HEADER.size + len(payload)
            ticket = self._last = Ticket()
            self._unsynced.append(ticket)
            return ticket

    def barrier(self) -> Ticket | None:
        """The ticket of the last frame written if it may not be durable yet (its sync may be running), else
        None: for a call that logs nothing but answers from what earlier frames did (a duplicate push)."""
        with self._lock:
            last = self._last
            return last if last is not None and not last.done else None

    def sync(self, ticket: Ticket) -> None:
        """Return once `ticket`'s frame is durable. Group commit: the first waiting caller fdatasyncs every
        frame written so far, for itself and for all the calls that wrote theirs meanwhile; they find their
        ticket synced and return without a sync of their own.

        A failed sync fails every frame not yet durable: the file is cut back to the end of the last durable
        frame and each of their calls raises (none was applied nor acknowledged; their retries land after)."""
        with self._sync_lock:
            if not ticket.done:
                with self._lock:
                    batch, self._unsynced, end, fd = self._unsynced, [], self.bytes, self._out.fileno()
                try:
                    os.fdatasync(fd)
                except OSError as err:
                    with self._lock:
                        failed = self._failure(err)
                        for t in [*batch, *self._unsynced]:
                            t.done, t.error = True, failed
                        self._unsynced = []
                        self._undo_partial(err, self.durable)
                        self.bytes = self.durable
                else:
                    self.durable = end
                    self.syncs += 1
                    for t in batch:
                        t.done = True
                    self.appends += len(batch)
        if ticket.error is not None:
            raise ticket.error

    def _failure(self, err: OSError) -> OSError:
        return OSError(
            err.errno,
            f"{err.strerror or err} while appending to {self.log_path(self.gen)} "
            f"({_free_space(self.dir)} free); the call was not logged nor applied",
        )

    def _undo_partial(self, err: OSError, end: int) -> None:
        """Drop what follows `end` (a partial frame, or frames that failed their sync): truncate and sync."""
        path = self.log_path(self.gen)
        with contextlib.suppress(
            OSError
        ):  # flushing the partial bytes may fail again; the truncate drops them
            self._out.close()
        try:
            with open(path, "r+b") as f:
                f.truncate(end)
                os.fsync(f.fileno())
            self._file = open(path, "ab")  # noqa: SIM115 - held open for appends
        except OSError as undo:
            self.broken = f"a failed append ({err}) could not be cut back ({undo})"

    def rotate(self, write_snapshot: Callable[[Path], None]) -> None:
        """Write snapshot gen+1 with `write_snapshot(tmp_dir)`, start its empty log, drop generation gen.
        Only between calls: every frame written must be synced (and applied) first."""
        if self._unsynced:
            raise RuntimeError(
                f"{len(self._unsynced)} frames of {self.log_path(self.gen)} are not synced yet"
            )
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
        self._out.close()
        self._file = open(new_log, "ab")  # noqa: SIM115
        self.gen, self.bytes, self.durable = gen, 0, 0
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
