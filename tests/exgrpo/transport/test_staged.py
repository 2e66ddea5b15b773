"""The staging file of a child engine core (`exgrpo.transport.staged`): one nameless file per stager, reused and
grown, its space reserved before it is written, stale files of dead samplers swept.

The full-directory test mounts a real 4 MiB tmpfs in a mount namespace of its own (`unshare`) and stages into it
in a subprocess, so a SIGBUS would show as that subprocess's death; a control in the same namespace writes through
a mapping of a sparse file (the staging of before) and must die by SIGBUS there.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from exgrpo.transport.staged import PREFIX, Stager, map_staged, sweep

ROOT = Path(__file__).resolve().parents[3]


def test_a_tied_state_dict_round_trips_once_through_a_private_mapping(tmp_path: Path) -> None:
    emb = torch.randn(8, 4)
    state = {"embed.weight": emb, "lm_head.weight": emb, "norm.weight": torch.ones(4, dtype=torch.bfloat16)}
    stager = Stager(candidates=(tmp_path,))
    with stager.stage(state) as staged:
        assert staged.nbytes == 8 * 4 * 4 + 64  # the tied matrix once, the norm in its own aligned slot
        got = dict(map_staged(staged.path, staged.layout))
        assert all(torch.equal(got[k], v) for k, v in state.items())
        got["norm.weight"].add_(1)  # a private mapping: the file keeps what was staged
        assert torch.equal(dict(map_staged(staged.path, staged.layout))["norm.weight"], state["norm.weight"])
    stager.close()
    assert stager.path is None


def test_one_nameless_file_is_reused_grown_and_released(tmp_path: Path) -> None:
    stager = Stager(candidates=(tmp_path,))
    small, big = {"w": torch.ones(64, 64)}, {"w": torch.full((128, 64), 2.0), "b": torch.ones(3)}
    inodes, paths = set(), set()
    for state in (small, small, big, small):
        with stager.stage(state) as staged:
            inodes.add(os.stat(staged.path).st_ino)
            paths.add(staged.path)
            assert os.listdir(tmp_path) == []  # no name in the directory, even mid-load
            got = dict(map_staged(staged.path, staged.layout))
            assert all(torch.equal(got[k], v) for k, v in state.items())
    assert len(paths) == 1 and len(inodes) == 1  # the same file for every load
    assert stager.reserved == os.stat(stager.path or "").st_size == 128 * 64 * 4 + 64  # grown once, kept
    releasing = Stager(candidates=(tmp_path,), keep=False)
    for _ in range(2):
        with releasing.stage(big) as staged:
            held = os.open(staged.path, os.O_RDONLY)  # the worker's side of the file
            assert os.fstat(held).st_size == 128 * 64 * 4 + 64
        assert releasing.path is None and releasing.reserved == 0  # given back after the load
        assert _holders(held) == 0  # no descriptor of this process but ours has the file
        assert os.fstat(held).st_size == 128 * 64 * 4 + 64  # never shrunk under a mapping
        os.close(held)


def _holders(fd: int) -> int:
    """How many other descriptors of this process open the file `fd` opens."""
    st = os.fstat(fd)
    count = 0
    for other in os.listdir("/proc/self/fd"):
        try:
            it = os.stat(f"/proc/self/fd/{other}")
            count += other != str(fd) and (it.st_dev, it.st_ino) == (st.st_dev, st.st_ino)
        except OSError:
            continue
    return count


def test_files_of_dead_samplers_are_swept_when_a_stager_starts(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    child = multiprocessing.get_context("fork").Process(target=os._exit, args=(0,))
    child.start()
    child.join()
    assert child.pid is not None
    dead = [
        tmp_path / f"{PREFIX}-{child.pid}-0123456789ab.bin",
        tmp_path / f"exgrpo-weights-{child.pid}-ab.bin",
    ]
    alive = tmp_path / f"{PREFIX}-{os.getpid()}-0123456789ab.bin"
    other = tmp_path / f"other-{child.pid}.bin"
    for path in (*dead, alive, other):
        path.write_bytes(b"x" * 1024)
    with caplog.at_level(logging.WARNING, logger="exgrpo.transport.staged"):
        Stager(candidates=(tmp_path,))
    assert sorted(os.listdir(tmp_path)) == sorted([alive.name, other.name])
    assert sum("a sampler that is gone" in r.getMessage() for r in caplog.records) == 2
    assert sweep(tmp_path) == 0


def test_no_directory_with_room_is_a_clear_error(tmp_path: Path) -> None:
    stager = Stager(candidates=(tmp_path / "missing",))
    with (
        pytest.raises(OSError, match="missing: not a directory.*enlarge /dev/shm"),
        stager.stage({"w": torch.ones(4)}),
    ):
        pass


CONTROL = """
import mmap, os, sys
with open(os.path.join(sys.argv[1], "sparse.bin"), "wb+") as f:  # the staging of before: a sparse file
    f.truncate(8 << 20)
    with mmap.mmap(f.fileno(), 8 << 20) as mm:
        mm[:] = b"x" * (8 << 20)
"""

STAGE = """
import logging, sys
from pathlib import Path
from types import SimpleNamespace
import torch
from exgrpo.transport import staged as s

logging.basicConfig(level=logging.WARNING, format="LOG %(message)s", stream=sys.stdout)
full, spare = Path(sys.argv[1]), Path(sys.argv[2])
weights = {"w": torch.arange(2 << 20, dtype=torch.float32)}  # 8 MiB, twice the tmpfs
for case in ("checked", "raced", "alone"):
    if case != "checked":  # another sampler's check saw room a moment ago: the free-space check passes
        s.shutil.disk_usage = lambda p: SimpleNamespace(free=1 << 40)
    stager = s.Stager(candidates=(full,) if case == "alone" else (full, spare))
    try:
        with stager.stage(weights) as staged:
            got = dict(s.map_staged(staged.path, staged.layout))["w"]
            print(case, "staged in", stager.directory, "equal", torch.equal(got, weights["w"]), flush=True)
    except OSError as err:
        print(case, "OSError", err, flush=True)
"""


def test_a_full_staging_directory_falls_back_or_fails_clearly_never_by_sigbus(tmp_path: Path) -> None:
    if shutil.which("unshare") is None:
        pytest.skip("no unshare: cannot mount a size-limited tmpfs here")
    probe = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"no mount namespace for a size-limited tmpfs: {probe.stderr.decode().strip()}")
    full, spare = tmp_path / "tmpfs", tmp_path / "spare"
    full.mkdir()
    spare.mkdir()
    (tmp_path / "control.py").write_text(CONTROL)
    (tmp_path / "stage.py").write_text(STAGE)
    script = textwrap.dedent(
        f"""
        mount -t tmpfs -o size=4m tmpfs {full} || exit 99
        {sys.executable} {tmp_path}/control.py {full}
        echo "control rc=$?"
        rm -f {full}/sparse.bin
        {sys.executable} {tmp_path}/stage.py {full} {spare}
        """
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = subprocess.run(
        ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", script],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    out = run.stdout
    assert run.returncode == 0, (run.returncode, out, run.stderr)
    assert f"control rc={128 + signal.SIGBUS}" in out, out  # the old way dies by SIGBUS in this directory
    assert f"checked staged in {spare} equal True" in out, out
    assert f"raced staged in {spare} equal True" in out, out  # the reservation failed, not the write
    assert "No space left on device" in out and "LOG staging 8 MiB of weights in" in out, out  # said so
    assert "alone OSError" in out and "enlarge /dev/shm" in out, out
    assert os.listdir(spare) == []


KILLED = """
import os, sys, time
from pathlib import Path
import torch
from exgrpo.transport.staged import Stager

with Stager(candidates=(Path(sys.argv[1]),)).stage({"w": torch.ones(1 << 20)}):
    print("loading", flush=True)
    time.sleep(60)  # the worker's load, during which the sampler is killed
"""


def test_a_sampler_killed_mid_load_leaves_no_file(tmp_path: Path) -> None:
    (tmp_path / "killed.py").write_text(KILLED)
    where = tmp_path / "staging"
    where.mkdir()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, str(tmp_path / "killed.py"), str(where)], stdout=subprocess.PIPE, text=True, env=env
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "loading"
    proc.kill()  # as Ray ends an actor
    assert proc.wait(30) == -signal.SIGKILL
    assert os.listdir(where) == []
