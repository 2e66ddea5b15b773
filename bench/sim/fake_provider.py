"""Ray's fake multi-node provider, told what a cloud's API tells the autoscaler when an instance is reclaimed.

Ray's `FakeMultiNodeProvider` (every node a raylet on this machine) keeps listing a node whose raylet was killed,
so the autoscaler counts the dead node as capacity and may never launch its replacement. `KillAwareProvider`
stops listing a worker node once its raylet has exited (and ends the node's other processes), as a cloud stops
listing a reclaimed instance. Used by `bench/sim/autoscaler.py` (`provider: {type: external, module: ...}`).
"""

from __future__ import annotations

import contextlib
from typing import Any

from ray.autoscaler._private.fake_multi_node.node_provider import FakeMultiNodeProvider


class KillAwareProvider(FakeMultiNodeProvider):
    def non_terminated_nodes(self, tag_filters: dict[str, str]) -> list[str]:
        with self.lock:
            for node_id, entry in list(self._nodes.items()):
                node = entry.get("node")  # the head's entry has none
                if node is not None and not _raylet_running(node):
                    del self._nodes[node_id]
                    with contextlib.suppress(Exception):  # what is left of it: agents, workers
                        node.kill_all_processes(check_alive=False, allow_graceful=False)
        return list(super().non_terminated_nodes(tag_filters))

    def terminate_node(self, node_id: str) -> None:
        with self.lock:
            if node_id not in self._nodes:  # already gone with its raylet
                return
        super().terminate_node(node_id)


def _raylet_running(node: Any) -> bool:
    raylets = node.all_processes.get("raylet", [])
    return any(info.process.poll() is None for info in raylets)
