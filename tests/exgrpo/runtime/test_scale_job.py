"""`python -m exgrpo.scale` names the job it found before it changes (or refuses to change) anything, and a
cluster with no exgrpo job is refused clearly (exit 2, nothing changed). Before: it talked about the cluster's
CPUs without naming a job, and "no running exgrpo job found" exited 1 without saying which cluster it saw."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import ray

from exgrpo import scale


@pytest.fixture
def cluster(monkeypatch):
    monkeypatch.setattr(scale, "probe_address", lambda address: None)
    monkeypatch.setattr(ray, "init", lambda *a, **k: None)
    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 2.0})
    monkeypatch.setattr(ray, "nodes", lambda: [{"Alive": True}])
    monkeypatch.setattr(ray, "available_resources", lambda: {"CPU": 0.0})
    monkeypatch.setattr(ray, "get", lambda ref: ref)
    state = SimpleNamespace(
        actors=lambda: {
            "a1": {"Name": "exgrpo-controller", "State": "ALIVE", "JobID": "02000000", "Pid": 41},
            "a0": {"Name": "exgrpo-controller", "State": "DEAD", "JobID": "01000000", "Pid": 40},
        },
        jobs=lambda: [
            {
                "JobID": "02000000",
                "DriverPid": 4242,
                "DriverIPAddress": "127.0.0.1",
                "StartTime": 0,
                "Entrypoint": "python -m exgrpo.run --config tiny-cpu",
            },
        ],
    )
    monkeypatch.setattr(scale, "ray_state", lambda: state)
    return monkeypatch


def _controller(samplers=2):
    call = lambda value: SimpleNamespace(remote=lambda **k: value)  # noqa: E731
    return SimpleNamespace(
        desired_samplers=call(samplers), sampler_resources=call((0.5, 0.0)), set_samplers=call(samplers + 1)
    )


def test_scale_names_the_job_it_found(cluster, capsys):
    cluster.setattr(ray, "get_actor", lambda name, namespace: _controller())
    assert scale.main(["--samplers", "3"]) == 2  # no room: refused
    captured = capsys.readouterr()
    assert "exgrpo job 02000000" in captured.out and "driver pid 4242" in captured.out
    assert "python -m exgrpo.run --config tiny-cpu" in captured.out and "2 samplers now" in captured.out


def test_a_cluster_with_no_exgrpo_job_is_refused_clearly(cluster, capsys):
    def missing(name, namespace):
        raise ValueError("Failed to look up actor")

    cluster.setattr(ray, "get_actor", missing)
    assert scale.main(["--samplers", "3"]) == 2
    err = capsys.readouterr().err
    assert "runs no exgrpo job" in err and "1 node, 2 CPUs" in err and "nothing was changed" in err
