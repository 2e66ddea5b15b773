"""The pool's node book without Ray's cluster (`actors.nodes.NodeBook`): which samplers a vanished node takes
with it, which a probe or a drain finds, when a drained one hands back, and which failures are node losses."""

from __future__ import annotations

from types import SimpleNamespace

import ray

from actors import nodes as nodes_module
from actors.nodes import ElasticHooks, NodeBook


def _book(nodes: dict[int, str | None], **hooks) -> NodeBook:
    """A book whose samplers (manager ids) joined with handles that are their nodes."""
    book = NodeBook(ElasticHooks(node_of=lambda handle: handle, **hooks))
    for aid, node in nodes.items():
        book.join(aid, node)
    return book


def test_a_lost_sampler_takes_the_other_samplers_of_its_node_and_no_others() -> None:
    nodes = {1: "node-a", 2: "node-a", 3: "node-b", 4: None, 5: "node-a"}
    book = _book(nodes)
    assert book.gone_with({1}, nodes) == {2, 5}
    assert book.gone_with({1, 3}, nodes) == {2, 5}  # node-b had no other sampler
    assert book.gone_with({1}, [1, 2, 3]) == {2}  # only the samplers asked about (5 has left the manager)


def test_a_sampler_whose_node_is_unknown_takes_nothing_with_it() -> None:
    book = _book({1: None, 2: None, 3: "node-a"})
    assert book.gone_with({1}, [1, 2, 3]) == set()
    assert book.gone_with(set(), [1, 2, 3]) == set()
    fixed = NodeBook(ElasticHooks())  # no node_of: every node unknown
    fixed.join(1, "node-a")
    fixed.join(2, "node-a")
    assert fixed.node(1) is None and fixed.gone_with({1}, [1, 2]) == set()


class _Probe:
    def __init__(self, gone: set[str]) -> None:
        self.gone = gone
        self.asked: set[str] = set()
        self.closed = False

    def __call__(self, nodes: set[str]) -> set[str]:
        self.asked = set(nodes)
        return self.gone & nodes

    def close(self) -> None:
        self.closed = True


def test_the_probe_is_asked_about_the_live_samplers_nodes_and_its_gone_nodes_take_their_samplers() -> None:
    probe = _Probe({"node-a", "node-c"})
    book = _book({1: "node-a", 2: "node-a", 3: "node-b", 4: None, 5: "node-c"}, probe=probe)
    assert book.probed_lost({1, 2, 3, 4}) == {1, 2}  # 5 is no sampler of the manager's now
    assert probe.asked == {"node-a", "node-b"}
    book.close()
    assert probe.closed
    assert _book({1: "node-a"}).probed_lost({1}) == set()  # no probe: nothing found


def test_a_drained_nodes_samplers_are_found_once_and_hand_back_at_the_deadline_less_the_grace(
    monkeypatch,
) -> None:
    now = [1000.0]
    monkeypatch.setattr(nodes_module, "time", SimpleNamespace(time=lambda: now[0]))
    soon = now[0] + 8.0
    drains = {"node-a": soon}
    reads = []

    def read() -> dict[str, float]:
        reads.append(1)
        return dict(drains)

    book = _book({1: "node-a", 2: "node-a", 3: "node-b"}, drains=read, preempt_grace_s=5.0)
    assert book.drained({1, 3}) == {1: soon}  # 2 left the manager meanwhile
    now[0] += 0.5
    assert book.drained({1, 3}) == {} and len(reads) == 1  # read at most once a second
    book.mark(1, deadline=soon)
    assert book.due() == []  # 7.5 s left, more than the 5 s grace
    now[0] += 3.0
    assert book.due() == [1]  # 4.5 s left: within the grace
    assert book.drained({1, 3}) == {} and len(reads) == 2  # read again, 1 marked already
    book.mark(3, deadline=0)  # drained without a deadline: never due
    assert book.due() == [1]
    book.forget(1)
    assert book.due() == [] and book.node(1) is None


def test_a_failure_is_a_node_loss_only_when_its_error_or_the_raylet_says_so() -> None:
    gone = {"node-a"}
    book = _book({1: "node-a", 2: "node-b", 3: None}, node_gone=lambda node: node in gone)
    unavailable = ray.exceptions.ActorUnavailableError("unreachable", None)
    assert book.lost(1, unavailable) and not book.lost(2, unavailable)
    assert not book.lost(3, unavailable)  # its node unknown: a failure
    assert book.lost(2, RuntimeError("The actor died because its node has died."))
    assert not book.lost(2, RuntimeError("the sampler raised"))
