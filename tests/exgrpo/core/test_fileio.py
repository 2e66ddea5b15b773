"""exgrpo.core.fileio: atomic file and directory writes (no half-written target, no leftovers, plain permissions)."""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

import pytest

from exgrpo.core import fileio
from exgrpo.core.fileio import atomic_path, atomic_write, atomic_write_text


def _entries(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_write_text_creates_parents_replaces_and_leaves_nothing(tmp_path: Path) -> None:
    target = tmp_path / "a" / "b" / "out.json"
    assert atomic_write_text(target, "{}\n") == target
    assert target.read_text() == "{}\n"
    atomic_write_text(target, "ünïcode\n")  # replaces; UTF-8 whatever the locale
    assert target.read_bytes() == "ünïcode\n".encode()
    assert _entries(target.parent) == ["out.json"]  # no temporary file left behind


def test_file_and_directory_get_the_permissions_of_a_plain_write(tmp_path: Path) -> None:
    plain_file, plain_dir = tmp_path / "plain.txt", tmp_path / "plain"
    plain_file.write_text("x")
    plain_dir.mkdir()
    atomic_write_text(tmp_path / "atomic.txt", "x")
    with atomic_path(tmp_path / "atomic", directory=True) as tmp:
        (tmp / "f").write_text("x")
    assert _mode(tmp_path / "atomic.txt") == _mode(plain_file)  # not tempfile's owner-only 0600
    assert _mode(tmp_path / "atomic") == _mode(plain_dir)  # not tempfile's 0700


def test_failed_write_keeps_the_old_target_and_cleans_up(tmp_path: Path) -> None:
    target = tmp_path / "data.txt"
    target.write_text("old")
    with pytest.raises(RuntimeError, match="boom"), atomic_path(target) as tmp:
        tmp.write_text("half")
        raise RuntimeError("boom")
    assert target.read_text() == "old" and _entries(tmp_path) == ["data.txt"]
    with pytest.raises(FileNotFoundError):  # a writer that writes nothing is an error, not an empty file
        atomic_write(target, lambda tmp: None)
    assert target.read_text() == "old" and _entries(tmp_path) == ["data.txt"]


def test_directory_replaces_an_existing_one_whole(tmp_path: Path) -> None:
    target = tmp_path / "model"
    target.mkdir()
    (target / "stale.bin").write_text("old")
    with atomic_path(target, directory=True) as tmp:
        assert tmp.is_dir() and tmp.parent == tmp_path and list(tmp.iterdir()) == []
        (tmp / "config.json").write_text("{}")
    assert _entries(target) == ["config.json"] and _entries(tmp_path) == ["model"]
    with pytest.raises(ValueError), atomic_path(target, directory=True) as tmp:
        (tmp / "partial").write_text("x")
        raise ValueError
    assert _entries(target) == ["config.json"] and _entries(tmp_path) == ["model"]


def test_directory_exist_ok_lets_the_first_writer_win(tmp_path: Path) -> None:
    target = tmp_path / "cache"
    with atomic_path(target, directory=True, exist_ok=True) as tmp:
        (tmp / "who").write_text("first")
    with atomic_path(target, directory=True, exist_ok=True) as tmp:
        (tmp / "who").write_text("second")
    assert (target / "who").read_text() == "first" and _entries(tmp_path) == ["cache"]


def test_directory_exist_ok_still_raises_real_failures(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(src: object, dst: object) -> None:
        raise PermissionError("read-only filesystem")

    monkeypatch.setattr(fileio.os, "rename", refuse)
    with pytest.raises(PermissionError), atomic_path(tmp_path / "cache", directory=True, exist_ok=True):
        pass
    assert _entries(tmp_path) == []  # nothing in place, temporary directory removed


def test_concurrent_directory_builds_leave_one_complete_target(tmp_path: Path) -> None:
    target = tmp_path / "built"
    barrier = threading.Barrier(6)

    def build(i: int) -> None:
        with atomic_path(target, directory=True, exist_ok=True) as tmp:
            barrier.wait()
            for name in ("config.json", "weights.bin"):
                (tmp / name).write_text(str(i))

    threads = [threading.Thread(target=build, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    contents = {(target / name).read_text() for name in ("config.json", "weights.bin")}
    assert len(contents) == 1  # one writer's complete build, never a mix
    assert _entries(tmp_path) == ["built"]


def test_file_replace_is_a_single_rename(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[str, str]] = []
    real = os.replace

    def spy(src: str | os.PathLike, dst: str | os.PathLike) -> None:
        seen.append((Path(src).name, Path(dst).name))
        real(src, dst)

    monkeypatch.setattr(fileio.os, "replace", spy)
    atomic_write_text(tmp_path / "x.txt", "1")
    ((src, dst),) = seen
    assert dst == "x.txt" and src.startswith(".x.txt.") and src.endswith(".tmp")
