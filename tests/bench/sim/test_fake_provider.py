"""`KillAwareProvider` without launching raylets: a worker node whose raylet exited is no longer listed (and its
other processes are ended), a live one and the head stay, and terminating a node already gone is a no-op."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from bench.sim.fake_provider import KillAwareProvider


class _Node:
    def __init__(self, *, raylet_exit: int | None) -> None:
        proc = SimpleNamespace(poll=lambda: raylet_exit)
        self.all_processes = {"raylet": [SimpleNamespace(process=proc)]}
        self.killed = False

    def kill_all_processes(self, **_: object) -> None:
        self.killed = True


@pytest.fixture
def provider(monkeypatch):
    monkeypatch.setenv("RAY_FAKE_CLUSTER", "1")
    p = KillAwareProvider({"gcs_address": "127.0.0.1:1"}, "test")
    head = next(iter(p._nodes))
    for name, node in (("live", _Node(raylet_exit=None)), ("dead", _Node(raylet_exit=-9))):
        p._nodes[name] = {"tags": dict(p._nodes[head]["tags"]), "node": node}
    return p, head


def test_a_node_whose_raylet_exited_is_no_longer_listed_and_its_processes_end(provider) -> None:
    p, head = provider
    dead = p._nodes["dead"]["node"]
    assert set(p.non_terminated_nodes({})) == {head, "live"}
    assert dead.killed and not p._nodes["live"]["node"].killed
    assert p.is_terminated("dead") and p.is_running("live")


def test_terminating_a_node_already_gone_is_a_no_op(provider) -> None:
    p, _ = provider
    p.non_terminated_nodes({})
    p.terminate_node("dead")  # Ray's provider would raise KeyError here
    p.terminate_node("live")
    assert "live" not in p._nodes
