"""`--dry-run` resolves a hub model id the way a start does (`exgrpo.models.resolve`): a cached id passes and
names its snapshot, a miss offline exits 2 naming the id and the fix, a miss online says a start downloads it
(and downloads nothing). Before, the dry run refused every hub id ("model path ... does not exist").
A hub error with no network names the fix even when HF_HUB_OFFLINE is not set."""

from __future__ import annotations

import subprocess
import sys

import pytest
from test_hub_models import COMMIT, REPO, build_hub_cache, offline_env

from exgrpo import run


@pytest.fixture(scope="module")
def hf_home(tmp_path_factory):
    home = tmp_path_factory.mktemp("hf")
    build_hub_cache(home)
    return home


def dry_run(hf_home, cwd, model):
    return subprocess.run(
        [sys.executable, "-m", "exgrpo.run", "--dry-run", "--config", "tiny-cpu", f"model.path={model}"],
        env=offline_env(hf_home),
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=300,
    )


def test_a_cached_hub_id_passes_the_dry_run_and_names_its_snapshot(hf_home, tmp_path):
    out = dry_run(hf_home, tmp_path, REPO)
    assert out.returncode == 0, out.stderr[-2000:]
    snapshot = hf_home / "hub" / "models--acme--tiny-math" / "snapshots" / COMMIT
    assert f"model: {REPO} -> {snapshot} (hub cache, commit {COMMIT[:12]})" in out.stdout
    assert "prompts within model.max_prompt_len" in out.stdout  # the data checked against its tokenizer


def test_an_uncached_hub_id_offline_exits_2_naming_the_id_and_the_fix(hf_home, tmp_path):
    out = dry_run(hf_home, tmp_path, "acme/not-cached")
    assert out.returncode == 2
    assert "model 'acme/not-cached' is not in the hub cache" in out.stderr
    assert "hf download acme/not-cached" in out.stderr and "Traceback" not in out.stderr


def _fake_hub(monkeypatch, *, online_error=None):
    import huggingface_hub
    from huggingface_hub import constants
    from huggingface_hub.errors import LocalEntryNotFoundError

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    calls = []

    def fake_snapshot_download(repo_id, *, revision=None, local_files_only=False, **kwargs):
        calls.append(local_files_only)
        if local_files_only:
            raise LocalEntryNotFoundError("not cached")
        raise online_error or AssertionError("the dry run downloaded the model")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_snapshot_download)
    return calls


def test_an_uncached_hub_id_online_says_a_start_downloads_it(monkeypatch, capsys):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    calls = _fake_hub(monkeypatch)
    assert run.main(["--dry-run", "--config", "tiny-cpu", "model.path=acme/not-cached"]) == 0
    out = capsys.readouterr().out
    assert "model: acme/not-cached is not in the hub cache" in out and "a start downloads it" in out
    assert calls and all(calls)  # the cache looked at, nothing downloaded


def test_no_network_names_the_fix_without_hf_hub_offline(monkeypatch):
    from huggingface_hub.errors import LocalEntryNotFoundError

    from exgrpo.models.resolve import ModelResolveError, resolve_hub

    _fake_hub(monkeypatch, online_error=LocalEntryNotFoundError("ConnectError: Name or service not known"))
    with pytest.raises(ModelResolveError) as err:
        resolve_hub("acme/not-cached")
    message = str(err.value)
    assert "could not be downloaded" in message and "Name or service not known" in message
    assert "HF_HUB_OFFLINE=1" in message and "hf download acme/not-cached" in message
    assert "network access" in message
