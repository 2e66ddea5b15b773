"""`python -m exgrpo.scale` cannot touch the wrong job: with no arguments it only lists the jobs it sees, a change
names its job (`--job ADDRESS/JOB_ID`, or the bare id where unique) or is refused, listing them, when more than one
is visible; the confirmation names the job changed. Before: it resized whichever job `ray.init("auto")` found
(another user's, on a shared machine), with no read-only mode, and its --help stopped mid-sentence."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import ray

from exgrpo import scale


class World:
    """Local Ray clusters by address, each with an exgrpo job's controller (or none); Ray numbers each
    cluster's jobs from 01000000, so two clusters' jobs share an id."""

    def __init__(self, samplers: dict[str, int | None]) -> None:
        self.samplers = dict(samplers)
        self.at: str | None = None
        self.changed: list[tuple[str, int]] = []

    def controller(self) -> SimpleNamespace:
        address = self.at

        def call(fn):
            return SimpleNamespace(remote=lambda **k: fn(**k))

        def set_samplers(n):
            self.changed.append((address, n))
            self.samplers[address] = n
            return n

        return SimpleNamespace(
            state=call(lambda: (self.samplers[address], False)),
            desired_samplers=call(lambda: self.samplers[address]),
            sampler_resources=call(lambda: (0.5, 0.0)),
            set_samplers=call(set_samplers),
        )

    def get_actor(self, name, namespace):
        if self.samplers.get(self.at) is None:
            raise ValueError("Failed to look up actor")
        return self.controller()

    def tables(self) -> SimpleNamespace:
        return SimpleNamespace(
            actors=lambda: {"a1": {"Name": "exgrpo-controller", "State": "ALIVE", "JobID": "01000000"}},
            jobs=lambda: [
                {
                    "JobID": "01000000",
                    "DriverPid": 4000 + int(self.at.rpartition(":")[2]) % 100,
                    "DriverIPAddress": self.at.partition(":")[0],
                    "Entrypoint": "python -m exgrpo.run --config tiny-cpu",
                }
            ],
        )


@pytest.fixture
def world(monkeypatch):
    w = World({"10.0.0.1:6379": 1, "10.0.0.2:6379": 2})

    def init(address=None, **kwargs):
        w.at = address

    monkeypatch.setattr(scale, "probe_address", lambda address: None)
    monkeypatch.setattr(
        scale, "addresses", lambda address: list(w.samplers) if address == "auto" else [address]
    )
    monkeypatch.setattr(ray, "init", init)
    monkeypatch.setattr(ray, "shutdown", lambda: None)
    monkeypatch.setattr(ray, "get", lambda ref: ref)
    monkeypatch.setattr(ray, "get_actor", w.get_actor)
    monkeypatch.setattr(ray, "available_resources", lambda: {"CPU": 0.0})
    monkeypatch.setattr(scale, "ray_state", w.tables)
    return w


def test_no_arguments_lists_the_jobs_and_changes_nothing(world, capsys):
    assert scale.main([]) == 0
    out = capsys.readouterr().out
    assert "2 exgrpo jobs (read-only; nothing was changed)" in out
    assert "10.0.0.1:6379/01000000: 1 sampler (a fixed count); driver pid 4079 on 10.0.0.1" in out
    assert "10.0.0.2:6379/01000000: 2 samplers" in out and "tiny-cpu" in out
    assert world.changed == []


def test_a_change_without_job_is_refused_when_two_are_visible(world, capsys):
    assert scale.main(["--samplers", "3"]) == 2
    err = capsys.readouterr().err
    assert "2 exgrpo jobs are visible and --job names none, so nothing was changed" in err
    assert "10.0.0.1:6379/01000000" in err and "10.0.0.2:6379/01000000" in err
    assert scale.main(["--job", "01000000", "--samplers", "3"]) == 2  # the bare id is on both clusters
    assert "names 2 jobs" in capsys.readouterr().err
    assert scale.main(["--job", "10.0.0.3:6379/01000000", "--samplers", "3"]) == 2
    assert world.changed == []


def test_the_job_named_is_the_one_changed_and_the_confirmation_names_it(world, capsys):
    world.samplers["10.0.0.1:6379"] = 3  # scaling down needs no room
    assert scale.main(["--job", "10.0.0.1:6379/01000000", "--samplers", "2"]) == 0
    out = capsys.readouterr().out
    assert "changed exgrpo job 10.0.0.1:6379/01000000 (driver pid 4079 on 10.0.0.1" in out and "3 -> 2" in out
    assert world.changed == [("10.0.0.1:6379", 2)] and world.samplers["10.0.0.2:6379"] == 2


def test_the_only_job_is_changed_without_job_and_named(world, capsys):
    world.samplers["10.0.0.2:6379"] = None  # that cluster runs no exgrpo job
    assert scale.main(["--samplers", "3"]) == 2  # no room on it: refused
    captured = capsys.readouterr()
    assert "found exgrpo job 10.0.0.1:6379/01000000" in captured.out and "1 samplers now" in captured.out
    assert "--job 10.0.0.1:6379/01000000 --samplers 1" in captured.err and world.changed == []
    world.samplers["10.0.0.1:6379"] = 4
    assert scale.main(["--samplers", "3"]) == 0 and world.changed == [("10.0.0.1:6379", 3)]


def test_no_exgrpo_job_is_refused_clearly(world, capsys):
    world.samplers = {"10.0.0.1:6379": None}
    assert scale.main(["--samplers", "3"]) == 2
    err = capsys.readouterr().err
    assert "run no exgrpo job" in err and "nothing was changed" in err
    assert scale.main([]) == 0 and "no exgrpo job on the Ray clusters seen" in capsys.readouterr().out


def test_the_clusters_looked_at(monkeypatch):
    from ray._private import services

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(services, "find_gcs_addresses", lambda: frozenset({"10.0.0.2:6379", "10.0.0.1:6379"}))
    assert scale.addresses("auto") == ["10.0.0.1:6379", "10.0.0.2:6379"]  # every local cluster
    assert scale.addresses("10.0.0.9:6379") == ["10.0.0.9:6379"]
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.5:6379")
    assert scale.addresses("auto") == ["auto"]  # Ray reads RAY_ADDRESS itself


def test_help_is_whole(capsys):
    with pytest.raises(SystemExit):
        scale.main(["--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "adds nodes on demand)." in out and "--job" in out and "read-only" in out
