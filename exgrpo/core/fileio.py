"""Atomic writes: the one "write under a temporary name, then rename" helper of the project.

A reader (or a process killed mid-write) never sees a half-written file or directory: the content is
produced next to the target under a hidden temporary name (`.<name>.<random>.tmp`, same filesystem)
and moved into place by one `os.replace` (files) or `os.rename` (directories). The temporary path is
made with the process's ordinary permissions (umask), not the owner-only ones of `tempfile`, so the
result is readable exactly as a plainly written file or directory would be.

Durable too: before the rename, every file under the temporary path and every directory in it is
fsync'd, and after it the parent directory is, so after a power loss the target is either the old
content or the complete new one (never a name pointing at truncated files).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path


def _temporary_sibling(target: Path) -> Path:
    return target.parent / f".{target.name}.{secrets.token_hex(8)}.tmp"


def fsync_path(path: Path) -> None:
    """fsync a file, or every file and directory under a directory (the directory itself last)."""
    if path.is_symlink():
        return
    if path.is_dir():
        for sub in sorted(path.rglob("*"), key=lambda q: len(q.parts), reverse=True):
            if not sub.is_symlink():
                fsync_one(sub)
    fsync_one(path)


def fsync_one(path: Path) -> None:
    """fsync one file or directory entry (not what a directory holds)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


@contextlib.contextmanager
def atomic_path(
    target: str | os.PathLike, *, directory: bool = False, exist_ok: bool = False
) -> Iterator[Path]:
    """Yield a temporary path next to `target`; when the block succeeds, move it to `target`.

    Files: the yielded path does not exist yet (the block creates it) and replaces any existing
    target. Directories: the yielded path is an empty directory. It replaces an existing target
    (the old one is renamed aside first, then deleted, so `target` is never half-deleted) unless
    `exist_ok`: then a target already in place, e.g. put there by a concurrent writer of the same
    content, wins and this write is discarded. On an exception nothing is moved and the temporary
    path is removed.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = _temporary_sibling(target)
    if directory:
        while True:
            try:
                tmp.mkdir()
                break
            except FileExistsError:  # a 64-bit name collision: draw another
                tmp = _temporary_sibling(target)
    try:
        yield tmp
        fsync_path(tmp)
        if not directory:
            os.replace(tmp, target)
        elif exist_ok:
            try:
                os.rename(tmp, target)
            except OSError:
                if not target.exists():  # not lost to another writer: a real failure
                    raise
        else:
            _replace_directory(tmp, target)
        fsync_one(target.parent)
    finally:
        if tmp.exists() or tmp.is_symlink():
            _remove(tmp)


def _replace_directory(tmp: Path, target: Path) -> None:
    if not (target.exists() or target.is_symlink()):
        try:
            os.rename(tmp, target)
            return
        except OSError:
            if not target.exists():
                raise  # not a target that appeared meanwhile: a real failure
    aside = _temporary_sibling(target)
    os.rename(target, aside)
    try:
        os.rename(tmp, target)
    except OSError:
        os.rename(aside, target)  # put the old target back
        raise
    _remove(aside)


def atomic_write(target: str | os.PathLike, write: Callable[[Path], object]) -> Path:
    """`write(tmp_path)` (which must create the file) then move it into place; returns `target`."""
    with atomic_path(target) as tmp:
        write(tmp)
    return Path(target)


def atomic_write_text(target: str | os.PathLike, text: str, *, encoding: str = "utf-8") -> Path:
    """Write `text` to `target` atomically (UTF-8 by default); returns `target` as a Path."""
    return atomic_write(target, lambda p: p.write_text(text, encoding=encoding))
