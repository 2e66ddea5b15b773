"""Hub model ids (`model.path=org/name[@revision]`, `evaluate --model`) against a real offline hub cache.

The cache is built here as the hub client lays it out (`$HF_HOME/hub/models--ORG--NAME/snapshots/<commit>/`
plus `refs/main`), and every command runs in a subprocess whose environment has `HF_HOME` and
`HF_HUB_OFFLINE=1` from its start (the client reads them at import)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from exgrpo.models.resolve import hub_id, model_record
from exgrpo.models.tiny import TinyModelSpec, build_tiny_model

COMMIT = "0123456789abcdef0123456789abcdef01234567"
REPO = "acme/tiny-math"
ROOT = Path(__file__).resolve().parents[3]


def build_hub_cache(hf_home: Path, repo: str = REPO, commit: str = COMMIT) -> Path:
    """A tiny model in an HF hub cache under `hf_home`, as `snapshot_download` leaves it; its snapshot dir."""
    org, name = repo.split("/")
    cached = hf_home / "hub" / f"models--{org}--{name}"
    snapshot = cached / "snapshots" / commit
    build_tiny_model(snapshot, spec=TinyModelSpec())
    (cached / "refs").mkdir(parents=True, exist_ok=True)
    (cached / "refs" / "main").write_text(commit)
    return snapshot


def offline_env(hf_home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    pythonpath = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    env |= {"HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "1", "PYTHONPATH": pythonpath, "OMP_NUM_THREADS": "1"}
    env.setdefault("RAY_AUTH_MODE", "disabled")
    return env


@pytest.fixture(scope="module")
def hf_home(tmp_path_factory) -> Path:
    home = tmp_path_factory.mktemp("hf")
    build_hub_cache(home)
    return home


def test_hub_ids_are_told_from_paths_and_builtins():
    assert hub_id("Qwen/Qwen2.5-Math-7B") == ("Qwen/Qwen2.5-Math-7B", None)
    assert hub_id("Qwen/Qwen2.5-Math-7B@main") == ("Qwen/Qwen2.5-Math-7B", "main")
    assert hub_id(f"org/name@{COMMIT}") == ("org/name", COMMIT)
    assert hub_id("org/name@refs/pr/1") == ("org/name", "refs/pr/1")
    for not_an_id in ("builtin:tiny", "/models/Qwen2.5-Math-7B", "./org/name", "~/m", "runs/x/final", "name"):
        assert hub_id(not_an_id) is None, not_an_id


def test_records_of_a_directory_and_of_a_hub_id(tmp_path):
    assert model_record(str(tmp_path), tmp_path) == {"model": str(tmp_path), "path": str(tmp_path)}
    snap = tmp_path / "snapshots" / COMMIT
    assert model_record(f"{REPO}@main", snap) == {
        "model": f"{REPO}@main",
        "repo_id": REPO,
        "revision": "main",
        "commit": COMMIT,
        "path": str(snap),
    }


RESOLVE = (
    "import sys; from exgrpo.models.resolve import resolve_hub; h = resolve_hub(sys.argv[1]); "
    "print(h.commit, h.path, h.downloaded)"
)


@pytest.mark.parametrize("spec", [REPO, f"{REPO}@main", f"{REPO}@{COMMIT}"])
def test_a_cached_id_resolves_offline_to_its_snapshot(hf_home, spec):
    out = subprocess.run(
        [sys.executable, "-c", RESOLVE, spec], env=offline_env(hf_home), capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr[-2000:]
    commit, path, downloaded = out.stdout.split()
    assert commit == COMMIT and downloaded == "False"
    assert Path(path) == hf_home / "hub" / "models--acme--tiny-math" / "snapshots" / COMMIT


def test_an_uncached_id_offline_exits_2_naming_it_before_ray_starts(hf_home, tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "exgrpo.run", "--config", "tiny-cpu", "model.path=acme/not-cached"],
        env=offline_env(hf_home),
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
    )
    assert out.returncode == 2, out.stderr[-2000:]
    assert "model 'acme/not-cached' is not in the hub cache" in out.stderr
    assert "HF_HUB_OFFLINE is set" in out.stderr and "hf download acme/not-cached" in out.stderr
    assert "Started a local Ray instance" not in out.stderr + out.stdout
    assert not (tmp_path / "runs").exists()  # nothing written for a model that cannot be had


def test_evaluate_takes_a_hub_id(hf_home, tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "exgrpo.evaluate", "--model", "acme/not-cached", "--data", "builtin:arith"],
        env=offline_env(hf_home),
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
    )
    assert out.returncode == 2 and "model 'acme/not-cached' is not in the hub cache" in out.stderr


def test_evaluate_scores_a_cached_hub_id_and_writes_outside_the_cache(hf_home, tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "exgrpo.evaluate", "--model", REPO, "--data", "builtin:arith"]
        + ["--num", "4", "--n", "2", "--max-tokens", "8"],
        env=offline_env(hf_home),
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    written = json.loads((tmp_path / "eval-acme--tiny-math-arith.json").read_text())
    assert written["model"] == str(hf_home / "hub" / "models--acme--tiny-math" / "snapshots" / COMMIT)
    snapshot = hf_home / "hub" / "models--acme--tiny-math" / "snapshots" / COMMIT
    assert not list(snapshot.glob("eval-*"))  # nothing written into the hub cache


@pytest.mark.slow  # 82 s in CI; resolving a cached hub id stays in CI (above, test_hub_dry_run)
@pytest.mark.integration
def test_a_run_from_a_hub_id_in_an_offline_cache_records_its_commit(hf_home, tmp_path):
    run = tmp_path / "run"
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "exgrpo.run",
            "--config",
            "tiny-cpu",
            f"model.path={REPO}",
            "trainer.steps=2",
            "trainer.checkpoint_every=1",
            "trainer.eval_every=0",
            f"logging.run_dir={run}",
            "logging.progress=false",
        ],
        env=offline_env(hf_home),
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=900,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    snapshot = str(hf_home / "hub" / "models--acme--tiny-math" / "snapshots" / COMMIT)
    assert snapshot in out.stderr  # the log names the snapshot every actor loads
    for where in (run, run / "checkpoints" / "step-000002"):
        record = json.loads((where / "base_model.json").read_text())
        assert record["repo_id"] == REPO and record["commit"] == COMMIT and record["path"] == snapshot
    assert (run / "final" / "model.safetensors").is_file()


def test_an_uncached_id_online_is_downloaded_with_a_progress_bar(tmp_path, monkeypatch):
    """No hub is reachable here: `snapshot_download` is replaced by one that lays the snapshot out in the cache,
    to check what resolve_hub asks of it (cache first, then a download of that revision with the hub's progress
    bars on, even after the quiet defaults turned them off) and how a failed download is reported."""
    import huggingface_hub
    from huggingface_hub import constants
    from huggingface_hub.errors import LocalEntryNotFoundError
    from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars

    from exgrpo.models.resolve import HUB_IGNORE, ModelResolveError, resolve_hub

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.delenv("HF_HUB_DISABLE_PROGRESS_BARS", raising=False)
    calls = []

    def fake_snapshot_download(repo_id, *, revision=None, local_files_only=False, **kwargs):
        calls.append((repo_id, revision, local_files_only, kwargs, are_progress_bars_disabled()))
        if local_files_only:
            raise LocalEntryNotFoundError("not cached")
        if repo_id == "acme/absent":
            raise OSError("Connection refused")
        return str(build_hub_cache(tmp_path / "hf", repo=repo_id))

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_snapshot_download)
    disable_progress_bars()  # as quiet_libraries leaves them
    try:
        hub = resolve_hub(f"{REPO}@v1.0")
        assert hub.downloaded and hub.commit == COMMIT and hub.revision == "v1.0"
        assert calls[0][:3] == (REPO, "v1.0", True)  # the cache first
        repo, revision, local, kwargs, bars_off = calls[1]
        assert (repo, revision, local, bars_off) == (REPO, "v1.0", False, False)  # downloaded, bars on
        assert kwargs == {"ignore_patterns": HUB_IGNORE}
        assert are_progress_bars_disabled()  # the quiet default again afterwards
        with pytest.raises(
            ModelResolveError, match="'acme/absent' could not be downloaded .*Connection refused"
        ):
            resolve_hub("acme/absent")
    finally:
        enable_progress_bars()
