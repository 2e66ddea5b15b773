"""`python -m exgrpo.run --dry-run`: the plan, whether it fits the cluster, and (with --resume) the resume
checks of a real start, with no Ray actor started."""

from __future__ import annotations

import json
import socket

import pytest

from exgrpo import run
from exgrpo.core.config_files import load_config
from exgrpo.loop.checkpoint import CONFIG_FILE, config_fingerprint
from exgrpo.runtime import clusters


@pytest.fixture(autouse=True)
def _local(monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.delenv("EXGRPO_SKIP_RESOURCE_CHECK", raising=False)


def test_a_plan_that_fits_this_machine_says_so(capsys):
    assert run.main(["--dry-run", "--config", "tiny-cpu"]) == 0
    out = capsys.readouterr().out
    assert "exgrpo-learner-0" in out
    cpus = clusters.local_cluster_cpus(load_config("tiny-cpu"))
    assert (
        f"fits a local cluster on this machine ({cpus} logical CPUs): the plan needs 2 of {cpus} CPUs" in out
    )


def test_more_gpus_than_this_machine_has_exits_2(capsys):
    assert run.main(["--dry-run", "learners.num_gpus=4096"]) == 2
    err = capsys.readouterr().err
    assert "the run cannot be placed on a local cluster on this machine" in err
    assert "the plan needs 4096 GPUs (2 samplers x 0 + 1 learner x 4096)" in err


def test_more_cpus_than_the_cluster_has_exits_2(monkeypatch, capsys):
    """RAY_ADDRESS set: the plan is checked against that cluster's resources (here a 2-CPU one)."""
    asked = []

    def two_cpus(address):
        asked.append(address)
        return {"CPU": 2.0, "GPU": 0.0}, [{"CPU": 2.0, "GPU": 0.0}], ("unknown", [])

    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    monkeypatch.setattr(clusters, "cluster_totals", two_cpus)
    assert run.main(["--dry-run", "samplers.num=4", "samplers.num_cpus=1"]) == 2
    err = capsys.readouterr().err
    assert asked == ["10.0.0.1:6379"]
    assert "the run cannot be placed on the Ray cluster at 10.0.0.1:6379" in err
    assert "the plan needs 5 CPUs (4 samplers x 1 + 1 learner x 1" in err and "the cluster has 2" in err
    assert run.main(["--dry-run", "samplers.num=1", "samplers.num_cpus=1"]) == 0
    assert "fits the Ray cluster at 10.0.0.1:6379: the plan needs 2 of 2 CPUs" in capsys.readouterr().out


def test_an_unreachable_cluster_is_named(monkeypatch, capsys):
    def unreachable(address):
        raise ConnectionError(f"could not connect to {address}")

    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    monkeypatch.setattr(clusters, "cluster_totals", unreachable)
    assert run.main(["--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "RAY_ADDRESS=10.0.0.1:6379 is not reachable (could not connect to 10.0.0.1:6379)" in err
    assert "unset RAY_ADDRESS" in err


def _run_dir(tmp_path, step, *overrides, model=True):
    """A run directory as a real run leaves it: config.yaml and one complete checkpoint at `step`."""
    run_dir = tmp_path / "run"
    cfg = load_config("tiny-cpu", [f"logging.run_dir={run_dir}", *overrides])
    ckpt = run_dir / "checkpoints" / f"step-{step:06d}"
    (ckpt / "model" if model else ckpt).mkdir(parents=True)
    (run_dir / "config.yaml").write_text(cfg.to_yaml())
    (ckpt / CONFIG_FILE).write_text(
        json.dumps({"fingerprint": config_fingerprint(cfg), "config": cfg.to_dict()})
    )
    (ckpt / "driver.json").write_text("{}")
    return run_dir


def test_resume_dry_run_lists_the_changes_and_starts_nothing(tmp_path, capsys):
    import ray

    run_dir = _run_dir(tmp_path, 4, "trainer.steps=4")
    before = sorted(p.name for p in run_dir.rglob("*"))
    assert run.main(["--dry-run", "--resume", str(run_dir), "trainer.steps=8", "samplers.num=1"]) == 0
    out = capsys.readouterr().out
    assert f"resume {run_dir} from step-000004: steps 4 -> 8" in out
    assert "changes (each allowed on resume): 2" in out
    assert "  - samplers.num: 2 -> 1" in out and "  - trainer.steps: 4 -> 8" in out
    assert run.main(["--dry-run", "--resume", str(run_dir), "trainer.steps=6"]) == 0
    assert "  - trainer.steps: 4 -> 6" in capsys.readouterr().out
    assert not ray.is_initialized()
    assert sorted(p.name for p in run_dir.rglob("*")) == before  # nothing written


def test_resume_dry_run_refuses_what_a_resume_refuses(tmp_path, capsys):
    run_dir = _run_dir(tmp_path, 4, "trainer.steps=4")
    assert run.main(["--dry-run", "--resume", str(run_dir)]) == 2
    assert "already finished 4 steps; pass trainer.steps=M>4" in capsys.readouterr().err
    args = ["--dry-run", "--resume", str(run_dir), "trainer.steps=8", "trainer.rollouts_per_question=8"]
    assert run.main(args) == 2
    err = capsys.readouterr().err
    assert "with a different config" in err and "trainer.rollouts_per_question: 4 -> 8" in err


def test_resume_dry_run_refuses_a_checkpoint_without_its_model(tmp_path, capsys):
    run_dir = _run_dir(tmp_path, 4, "trainer.steps=4", model=False)
    assert run.main(["--dry-run", "--resume", str(run_dir), "trainer.steps=8"]) == 2
    assert "from step-000004: it has no model/ directory" in capsys.readouterr().err


def test_fresh_dry_run_refuses_another_runs_checkpoints(tmp_path, capsys):
    run_dir = _run_dir(tmp_path, 4, "trainer.steps=4")
    assert run.main(["--dry-run", "--config", "tiny-cpu", f"logging.run_dir={run_dir}"]) == 2
    assert "already holds the checkpoint step-000004 of an earlier run" in capsys.readouterr().err


def test_an_address_where_nothing_listens_fails_at_once():
    with socket.socket() as s:  # a port bound and released: nothing listens there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(ConnectionError, match=f"nothing answers at 127.0.0.1:{port}"):
        clusters.cluster_totals(f"127.0.0.1:{port}")
