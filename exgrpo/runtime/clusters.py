"""The clusters a run could use, read without starting an actor, and the dry run's fit check against them.

`local_cluster_cpus` and `local_resources`: the local cluster `init_ray` would start here (its logical
CPUs, and the GPUs, memory and object store Ray would detect); `cluster_totals`: the running cluster at
an address (after `probe_address`, a plain TCP probe, since `ray.init` retries a silent address for
minutes). `dry_run_fit(cfg)` (`python -m exgrpo.run --dry-run`) checks the run's plan against the one a
run would use, as a start does (`exgrpo.runtime.resources.shortfalls`), and with `samplers.autoscale` says how
many of its `autoscale_max` samplers that cluster holds as it is, and whether an autoscaler can add nodes for
the rest (`autoscale_reach`; tests: tests/exgrpo/runtime/test_autoscale_reach.py).
"""

from __future__ import annotations

import dataclasses
import os
import socket
from pathlib import Path
from typing import Any

from exgrpo.core.config import Config
from exgrpo.core.positions import check_context
from exgrpo.runtime.resources import (
    ResourceError,
    alive_nodes,
    model_weight_bytes,
    plan_resources,
    shortfalls,
)


def local_cluster_cpus(cfg: Config) -> int:
    """The logical CPUs `init_ray` gives a local cluster: the machine's, or as many as the plan reserves
    when that is more (the actors then share the cores)."""
    s, lr = cfg.samplers, cfg.learners
    needed = s.num * s.num_cpus + lr.num * lr.num_cpus
    return max(machine_cpus(), int(needed + 0.999))


def machine_cpus() -> int:
    """The CPUs a local Ray cluster offers by default: Ray's own count, which honours the container's CPU
    quota and affinity (os.cpu_count() gives the host's, e.g. 48 on a 2-core container)."""
    try:
        from ray._private.utils import get_num_cpus

        return max(1, int(get_num_cpus()))
    except Exception:  # a Ray without that helper: the CPUs this process may run on
        return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def local_resources(cfg: Config) -> dict[str, float]:
    """The resources a local cluster started by `init_ray` would have, resolved the way Ray resolves them
    when it starts one (its GPU detection, memory and object store sizes), without starting it."""
    from ray._private.resource_and_label_spec import ResourceAndLabelSpec

    spec = ResourceAndLabelSpec(num_cpus=local_cluster_cpus(cfg)).resolve(
        is_head=True, node_ip_address="127.0.0.1"
    )
    return {
        "CPU": float(spec.num_cpus),
        "GPU": float(spec.num_gpus),
        "memory": float(spec.memory),
        "object_store_memory": float(spec.object_store_memory),
    }


def probe_address(address: str, timeout_s: float = 5.0) -> None:
    """A plain TCP connection to a `host:port` Ray address (other forms, such as `auto`, pass): `ray.init`
    retries an address where nothing answers for minutes. Raises ConnectionError when nothing answers."""
    host, _, port = address.split("://")[-1].rpartition(":")
    if host and port.isdigit():
        try:
            socket.create_connection((host, int(port)), timeout=timeout_s).close()
        except OSError as err:
            raise ConnectionError(f"nothing answers at {host}:{port}: {err}") from err


def cluster_totals(address: str) -> tuple[dict[str, float], list[dict[str, float]], tuple[str, list[str]]]:
    """The total resources, alive nodes and `autoscaler_status` of the running cluster at `address` (connects
    as a driver, starts no actor, disconnects).

    A `host:port` address is first probed (`probe_address`). Raises ConnectionError when nothing answers.
    """
    probe_address(address)
    import ray

    from exgrpo.runtime.elastic import autoscaler_status

    ray.init(address=address, namespace="exgrpo", configure_logging=False, log_to_driver=False)
    try:
        return dict(ray.cluster_resources()), alive_nodes(ray), autoscaler_status()
    finally:
        ray.shutdown()


def dry_run_fit(cfg: Config) -> str:
    """Whether the plan fits the cluster a run would use (`python -m exgrpo.run --dry-run`), checked as at
    start (`shortfalls`): the cluster at RAY_ADDRESS when it is set and reachable, else a local cluster on
    this machine. One line when it fits; a `ResourceError` naming what is missing and the fix when not."""
    if os.environ.get("EXGRPO_SKIP_RESOURCE_CHECK"):
        return "resources not checked: EXGRPO_SKIP_RESOURCE_CHECK is set"
    if Path(cfg.model.path).is_dir():  # a builtin model is checked when it is built (`build_system`)
        check_context(cfg.model, cfg.model.path)
    plan = plan_resources(cfg, model_bytes=model_weight_bytes(cfg.model.path))
    address = os.environ.get("RAY_ADDRESS")
    nodes: list[dict[str, float]] = []
    autoscaler: tuple[str, list[str]] = ("local", [])  # a local cluster a run starts has none
    if address:
        try:
            total, nodes, autoscaler = cluster_totals(address)
            where, have = f"the Ray cluster at {address}", "the cluster has {n}"
        except (ConnectionError, TimeoutError, RuntimeError, ValueError) as err:
            raise ResourceError(
                f"RAY_ADDRESS={address} is not reachable ({err}): a run would fail to attach; start the "
                "cluster (ray start --head) or unset RAY_ADDRESS to run on a local cluster"
            ) from err
    else:
        total = local_resources(cfg)
        logical, cores = local_cluster_cpus(cfg), machine_cpus()
        over = (
            f" on its {cores} cores: the plan oversubscribes them, so its actors share cores and run slower"
            if logical > cores
            else ""
        )
        where = f"a local cluster on this machine ({logical} logical CPUs{over})"
        have = "a local cluster here would have {n}"
    problems = shortfalls(cfg, plan, total, nodes, have=have)
    if problems:
        raise ResourceError(f"the run cannot be placed on {where}:\n  - " + "\n  - ".join(problems))
    fit = (
        f"fits {where}: the plan needs {plan.cpus:g} of {total.get('CPU', 0):g} CPUs and "
        f"{plan.gpus:g} of {total.get('GPU', 0):g} GPUs"
    )
    reach = autoscale_reach(cfg, total, nodes, autoscaler=autoscaler)
    return f"{fit}\n{reach}" if reach else fit


def most_samplers(cfg: Config, total: dict[str, float], nodes: list[dict[str, float]]) -> int:
    """The most samplers in [`samplers.autoscale_min`, `autoscale_max`] that fit these resources beside the
    learners, checked as a start checks the plan (`shortfalls`); `samplers.num` (which fits: checked before)
    when none does."""
    s, model_bytes = cfg.samplers, model_weight_bytes(cfg.model.path)
    for n in range(s.autoscale_max, s.autoscale_min - 1, -1):
        sized = dataclasses.replace(cfg, samplers=dataclasses.replace(s, num=n))
        if not shortfalls(sized, plan_resources(sized, model_bytes=model_bytes), total, nodes):
            return n
    return min(s.num, s.autoscale_max)


def autoscale_reach(
    cfg: Config, total: dict[str, float], nodes: list[dict[str, float]], *, autoscaler: tuple[str, list[str]]
) -> str | None:
    """The dry run's line on the autoscale policy's largest target (None when the policy is off): whether
    `autoscale_max` samplers fit the cluster as it is, and if not whether anything can add nodes for the rest.
    `autoscaler`: `exgrpo.runtime.elastic.autoscaler_status` of the cluster at RAY_ADDRESS, or ("local", [])
    for the local cluster a run starts (which has none)."""
    s = cfg.samplers
    if not s.autoscale:
        return None
    most, top = most_samplers(cfg, total, nodes), s.autoscale_max
    if most >= top:
        return (
            f"samplers.autoscale: the cluster as it is holds all autoscale_max={top} samplers beside the "
            "learners: the policy's largest target is reachable"
        )
    short = (
        f"samplers.autoscale: the cluster as it is holds {most} of autoscale_max={top} samplers beside the "
        "learners; "
    )
    kind, types = autoscaler
    rest: dict[str, Any] = {
        "local": "a local cluster has no autoscaler, so samplers past "
        f"{most} would wait unplaced: set samplers.autoscale_max={most}, or run on an autoscaling Ray "
        'cluster (docs/operating.md, "Elastic samplers, step by step")',
        "none": "no autoscaler can add nodes there (its nodes were started by hand; Ray's read-only provider), "
        f"so samplers past {most} would wait unplaced: set samplers.autoscale_max={most}, or start the "
        "cluster with an autoscaler (ray start --autoscaling-config, KubeRay's enableInTreeAutoscaling)",
        "autoscaler": "the rest need nodes from its autoscaler (one runs there; its nodes now: "
        f"{', '.join(types) or 'none named'}); whether its node types and max_workers allow {top} samplers is "
        "not checked here",
    }
    return short + rest.get(
        kind,
        "whether an autoscaler can add nodes there was not readable (no autoscaler status in its GCS), so "
        f"samplers past {most} may wait unplaced",
    )
