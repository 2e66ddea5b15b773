"""`python -m exgrpo.scale --auto` and the controller's two modes: an operator's `--samplers N` fixes the count
and turns `samplers.autoscale`'s policy off; `--auto` hands the count back (refused when the run has no
policy); `--samplers` and `--auto` exclude each other."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import ray

from exgrpo import scale
from exgrpo.runtime.controller import Controller


def test_the_controller_holds_the_mode():
    c = Controller(samplers=2, autoscale=True)
    assert c.state() == (2, True)
    c.set_samplers(n=4)
    assert c.state() == (4, False)  # an operator's count holds
    assert c.set_auto() and c.state() == (4, True)
    assert Controller(samplers=2, autoscale=True, auto=False).state() == (2, False)  # a replaced controller
    with pytest.raises(ValueError, match="no autoscale policy"):
        Controller(samplers=2).set_auto()


def _cli(monkeypatch, controller):
    monkeypatch.setattr(scale, "probe_address", lambda address: None)
    monkeypatch.setattr(scale, "addresses", lambda address: ["10.0.0.1:6379"])
    monkeypatch.setattr(ray, "init", lambda *a, **k: None)
    monkeypatch.setattr(ray, "shutdown", lambda: None)
    monkeypatch.setattr(ray, "get", lambda ref: ref)
    monkeypatch.setattr(ray, "get_actor", lambda name, namespace: controller)
    monkeypatch.setattr(scale, "describe_job", lambda: ("02000000", "driver pid 42 on 10.0.0.1"))


def _remote(fn):
    return SimpleNamespace(remote=lambda **k: fn(**k))


def test_auto_hands_the_count_back(monkeypatch, capsys):
    real = Controller(samplers=3, autoscale=True)
    real.set_samplers(n=5)
    fake = SimpleNamespace(
        state=_remote(real.state),
        desired_samplers=_remote(real.desired_samplers),
        set_auto=_remote(real.set_auto),
    )
    _cli(monkeypatch, fake)
    assert scale.main(["--job", "02000000", "--auto"]) == 0
    out = capsys.readouterr().out
    assert (
        "changed exgrpo job 10.0.0.1:6379/02000000 (driver pid 42 on 10.0.0.1): handed the sampler count "
        in out
    )
    assert "back to its autoscale policy" in out
    assert real.state() == (5, True)


def test_samplers_and_auto_exclude_each_other(capsys):
    with pytest.raises(SystemExit) as stop:
        scale.main(["--samplers", "3", "--auto"])
    assert stop.value.code == 2 and "not allowed with" in capsys.readouterr().err
