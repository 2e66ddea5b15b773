"""The pool's elastic half without Ray: which samplers a vanished node takes with it."""

from __future__ import annotations

from actors.pool_elastic import ElasticPool


class _Manager:
    def __init__(self, ids: list[int]) -> None:
        self.ids = ids

    def actor_ids(self) -> list[int]:
        return list(self.ids)


def _pool(nodes: dict[int, str | None]) -> ElasticPool:
    pool = ElasticPool()
    pool.manager = _Manager(list(nodes))
    pool._nodes = dict(nodes)
    return pool


def test_a_lost_sampler_takes_the_other_samplers_of_its_node_and_no_others() -> None:
    pool = _pool({1: "node-a", 2: "node-a", 3: "node-b", 4: None, 5: "node-a"})
    assert pool.gone_with({1}) == {2, 5}
    assert pool.gone_with({1, 3}) == {2, 5}  # node-b had no other sampler


def test_a_sampler_whose_node_is_unknown_takes_nothing_with_it() -> None:
    pool = _pool({1: None, 2: None, 3: "node-a"})
    assert pool.gone_with({1}) == set()
    assert pool.gone_with(set()) == set()


class _Probe:
    def __init__(self, gone: set[str]) -> None:
        self.gone = gone
        self.asked: set[str] = set()

    def __call__(self, nodes: set[str]) -> set[str]:
        self.asked = set(nodes)
        return self.gone & nodes


def test_the_probe_is_asked_about_the_live_samplers_nodes_and_its_gone_nodes_take_their_samplers() -> None:
    pool = _pool({1: "node-a", 2: "node-a", 3: "node-b", 4: None})
    pool.probe = _Probe({"node-a", "node-c"})
    assert pool.probed_lost() == {1, 2}
    assert pool.probe.asked == {"node-a", "node-b"}
    pool.probe = None
    assert pool.probed_lost() == set()
