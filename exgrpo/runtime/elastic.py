"""Elastic samplers on Ray's autoscaler: the sampler pool's hooks into the cluster
(`actors.nodes.ElasticHooks`), built by `pool_hooks` for `exgrpo.runtime.parts.make_samplers`.

`ClusterRequest` asks the autoscaler for the target's sampler bundles (`request_resources`; each ask replaces
the last); `node_of` / `node_gone` place a sampler and tell a vanished node from a crash; `NodeProbe` connects
to each sampler node's raylet in the background, so a node gone without notice is seen in about
`samplers.node_probe_s`; `DrainWatch` reads the nodes drained with a deadline (a spot notice); `dry_run_line`
is `--dry-run`'s line on the largest ask. `autoscaler_status` reads from the GCS whether an autoscaler that can
add nodes watches the cluster (Ray's read-only provider, which a local cluster or one started without
`--autoscaling-config` runs, cannot): the start says so, and `ClusterRequest` asks quietly there. More:
docs/operating.md, "Elastic and spot samplers"; tests/integration/test_elastic_autoscaler.py,
tests/exgrpo/runtime/test_autoscale_reach.py.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from actors.nodes import ElasticHooks

log = logging.getLogger("exgrpo")


def sampler_bundle(samplers: Any) -> dict[str, float]:
    """What one sampler reserves, as a resource bundle (`samplers.num_cpus`, `num_gpus` x tensor parallel)."""
    bundle = {
        "CPU": float(samplers.num_cpus),
        "GPU": float(samplers.num_gpus) * samplers.tensor_parallel_size,
    }
    return {k: v for k, v in bundle.items() if v > 0}


NONE, AUTOSCALER, UNKNOWN = "none", "autoscaler", "unknown"  # `autoscaler_status`'s verdicts


def autoscaler_from_status(raw: bytes | str | None) -> tuple[str, list[str]]:
    """The verdict on the (v1) autoscaler's status JSON, as its monitor writes it to the GCS, and the node types
    it names: NONE when every node type is Ray's read-only provider's (`node_<id>`, one per node started by hand:
    nothing can add a node), AUTOSCALER when it names others (a cluster config's node types, e.g. KubeRay's worker
    groups), UNKNOWN without a readable status (not written yet, or the v2 autoscaler)."""
    try:
        report = json.loads(raw or "")["autoscaler_report"]
    except (ValueError, KeyError, TypeError):
        return UNKNOWN, []
    types = set((report.get("node_type_mapping") or {}).values())
    types |= set(report.get("active_nodes") or {}) | set(report.get("idle_nodes") or {})
    types |= set(report.get("pending_launches") or {})
    named = sorted(t for t in types if not str(t).startswith("node_"))
    if not types:
        return UNKNOWN, []
    return (AUTOSCALER, named) if named else (NONE, [])


def autoscaler_status() -> tuple[str, list[str]]:
    """`autoscaler_from_status` of the connected cluster (after `ray.init`)."""
    try:
        from ray._private import ray_constants
        from ray.experimental.internal_kv import _internal_kv_get

        return autoscaler_from_status(_internal_kv_get(ray_constants.DEBUG_AUTOSCALING_STATUS))
    except Exception:  # noqa: BLE001 - an unreadable status says nothing either way
        return UNKNOWN, []


NO_AUTOSCALER = (
    "no autoscaler can add nodes to this Ray cluster (a local cluster, or one started without "
    "--autoscaling-config): samplers past what its nodes hold wait unplaced (the run goes on without them); "
    "python -m exgrpo.run --dry-run says how many fit, docs/operating.md how to run on an autoscaling cluster"
)


class ClusterRequest:
    """`on_scale(n)`: ask Ray's autoscaler for n sampler bundles (each call replaces the previous request).
    `status` (default `autoscaler_status`) is read at the first ask: on a cluster without an autoscaler the
    asks are made quietly (a warning says so once), a 0 (the run's end) is logged as the request's release."""

    def __init__(
        self,
        bundle: dict[str, float],
        *,
        request: Callable[..., Any] | None = None,
        status: Callable[[], tuple[str, list[str]]] | None = None,
        verdict: str | None = None,
    ) -> None:
        if request is None:
            from ray.autoscaler.sdk import request_resources

            request = request_resources
        self.bundle, self.request, self.status = bundle, request, status or autoscaler_status
        self.asked: list[tuple[float, int]] = []  # (wall clock, samplers asked for)
        # `autoscaler_status`'s (already logged when given), else read (and logged) at the first ask
        self.verdict = verdict if verdict in (NONE, AUTOSCALER) else None

    def __call__(self, num: int) -> None:
        if not self.bundle:  # samplers that reserve nothing need no node
            return
        if self.verdict is None:
            self.verdict, types = self.status()
            if self.verdict == NONE:
                log.warning("samplers.autoscale: %s", NO_AUTOSCALER)
            elif self.verdict == AUTOSCALER:
                log.info(
                    "samplers.autoscale: an autoscaler runs on this Ray cluster (its nodes now: %s)",
                    ", ".join(types),
                )
        try:
            self.request(bundles=[dict(self.bundle) for _ in range(num)])
        except Exception as err:  # noqa: BLE001 - no autoscaler is no reason to stop a run
            log.warning("could not ask Ray's autoscaler for %d sampler bundles: %s", num, err)
            return
        self.asked.append((time.time(), num))
        level = logging.DEBUG if self.verdict == NONE else logging.INFO
        if num == 0:
            log.log(level, "released the run's request to Ray's autoscaler for sampler bundles")
        else:
            log.log(level, "asked Ray's autoscaler for %d sampler bundles of %s", num, self.bundle)


def node_of(handle: Any) -> str | None:
    """The node (hex id) a started actor runs on, or None when the GCS does not say."""
    try:
        from ray._private import state

        info = state.actors(actor_id=handle._actor_id.hex())
        return str(info["Address"]["NodeID"]) or None
    except Exception:  # noqa: BLE001 - without a node the sampler is simply never seen drained
        return None


def node_gone(node: str) -> bool:
    """Whether a node's raylet is gone: the GCS marks it dead, or its port refuses (or does not answer) a
    connection. Asked after a sampler on it became unreachable, before the GCS has noticed (a killed raylet,
    a reclaimed host); a sampler killed on a live node finds its raylet there."""
    import ray

    info = next((n for n in ray.nodes() if n.get("NodeID") == node), None)
    if info is None or not info.get("Alive"):
        return True
    return raylet_answer((info["NodeManagerAddress"], int(info["NodeManagerPort"])), timeout_s=1.0) != "up"


def raylet_answer(address: tuple[str, int], *, timeout_s: float) -> str:
    """ "up" (a connection opened), "refused" (nothing listens: the raylet is gone) or "timeout" (a timeout or an
    unreachable host)."""
    try:
        with socket.create_connection(address, timeout=timeout_s):
            return "up"
    except ConnectionRefusedError:
        return "refused"
    except OSError:
        return "timeout"


def raylet_addresses() -> dict[str, tuple[str, int]]:
    """Every alive node's raylet address (hex id -> host, port), from the GCS."""
    import ray

    return {
        n["NodeID"]: (n["NodeManagerAddress"], int(n["NodeManagerPort"]))
        for n in ray.nodes()
        if n.get("Alive")
    }


class NodeProbe:
    """`probe(nodes)`: which of `nodes` (hex ids) are gone, never blocking. A daemon thread connects to each
    watched node's raylet every `every_s`: a refused connection, or a node the GCS does not list as alive when
    the probe first looks up its address, is gone at once; a host that vanished (the connection times out after `timeout_s`) is gone after `misses`
    timeouts in a row. Each call replaces the watched set; the caller's own node is never watched (if it went,
    so did the caller)."""

    def __init__(
        self,
        *,
        every_s: float,
        timeout_s: float = 1.0,
        misses: int = 2,
        addresses: Callable[[], dict[str, tuple[str, int]]] = raylet_addresses,
        own_node: str | None = None,
    ) -> None:
        self.every_s, self.timeout_s, self.misses = every_s, timeout_s, misses
        self._addresses, self._own = addresses, own_node
        self._lock = threading.Lock()
        self._watched: set[str] = set()
        self._gone: set[str] = set()
        self._known: dict[str, tuple[str, int]] = {}
        self._missed: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __call__(self, nodes: set[str]) -> set[str]:
        with self._lock:
            self._watched = set(nodes) - {self._own}
            gone = self._gone & nodes
            start = self._thread is None and bool(self._watched)
        if start:
            self._thread = threading.Thread(target=self._run, name="exgrpo-node-probe", daemon=True)
            self._thread.start()
        return gone

    def close(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            try:
                self.probe_once()
            except Exception as err:  # noqa: BLE001 - a failed round is retried; calls that fail still tell
                log.warning("node probe round failed (retried in %.2f s): %s", self.every_s, err)

    def probe_once(self) -> None:
        """One round over the watched nodes (the thread's body; tests call it directly)."""
        with self._lock:
            watched = self._watched - self._gone
        if watched - self._known.keys():
            alive = self._addresses()
            self._known.update({n: alive[n] for n in watched if n in alive})
        gone = {n for n in watched if n not in self._known}
        for node in watched - gone:
            verdict = raylet_answer(self._known[node], timeout_s=self.timeout_s)
            self._missed[node] = self._missed.get(node, 0) + 1 if verdict == "timeout" else 0
            if verdict == "refused" or self._missed[node] >= self.misses:
                gone.add(node)
        if gone:
            log.warning("node probe: %s gone (raylet not answering)", ", ".join(sorted(n[-8:] for n in gone)))
            with self._lock:
                self._gone |= gone


def own_node() -> str | None:
    import ray

    try:
        return str(ray.get_runtime_context().get_node_id())
    except Exception:  # noqa: BLE001 - then every node is watched, the caller's too
        return None


class DrainWatch:
    """`drains()`: node (hex id) -> deadline (wall clock, s; 0 for none) of every node being drained."""

    def __init__(self) -> None:
        self._client: Any = None

    def __call__(self) -> dict[str, float]:
        try:
            if self._client is None:
                import ray
                from ray._raylet import GcsClient  # type: ignore[attr-defined]

                self._client = GcsClient(address=ray.get_runtime_context().gcs_address)
            nodes = self._client.get_draining_nodes(timeout=5)
        except Exception as err:  # noqa: BLE001 - a missed read is retried a second later
            log.debug("could not read the draining nodes: %s", err)
            return {}
        return {_hex(node): deadline_ms / 1000.0 for node, deadline_ms in nodes.items()}


def _hex(node: Any) -> str:
    return node.hex() if isinstance(node, bytes) else str(node)


def pool_hooks(cfg: Any) -> ElasticHooks:
    """The `SamplerPool`'s hooks of an elastic fleet: drains and node lookups always (spot samplers at a fixed
    count also lose nodes), the autoscaler request with `samplers.autoscale`."""
    s = cfg.samplers
    verdict, types = autoscaler_status() if s.autoscale else (UNKNOWN, [])  # UNKNOWN: read at the first ask
    if verdict == NONE:
        log.warning("samplers.autoscale: %s", NO_AUTOSCALER)
    elif verdict == AUTOSCALER:
        log.info(
            "samplers.autoscale: an autoscaler runs on this Ray cluster (its nodes now: %s)", ", ".join(types)
        )
    ask = s.autoscale and s.autoscale_request_resources
    return ElasticHooks(
        on_scale=ClusterRequest(sampler_bundle(s), verdict=verdict) if ask else None,
        node_of=node_of,
        drains=DrainWatch(),
        node_gone=node_gone,
        probe=NodeProbe(every_s=s.node_probe_s, own_node=own_node()) if s.node_probe_s > 0 else None,
        preempt_grace_s=s.preempt_grace_s,
    )


def dry_run_line(cfg: Any) -> str | None:
    """`--dry-run`'s line on what the autoscale policy may ask the cluster for; None when it is off."""
    s = cfg.samplers
    if not s.autoscale:
        return None
    bundle = sampler_bundle(s)
    total = ", ".join(f"{v * s.autoscale_max:g} {k}" for k, v in bundle.items()) or "nothing"
    each = ", ".join(f"{v:g} {k}" for k, v in bundle.items()) or "nothing"
    return (
        f"samplers.autoscale: {s.autoscale_min}..{s.autoscale_max} samplers; the run may ask Ray's autoscaler for "
        f"up to {s.autoscale_max} x ({each}) = {total} (how many the cluster holds: the fit lines below)"
    )
