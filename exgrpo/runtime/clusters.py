"""The clusters a run could use, read without starting an actor, and the dry run's fit check against them.

`local_cluster_cpus` and `local_resources`: the local cluster `init_ray` would start here (its logical
CPUs, and the GPUs, memory and object store Ray would detect); `cluster_totals`: the running cluster at
an address (after `probe_address`, a plain TCP probe, since `ray.init` retries a silent address for
minutes). `dry_run_fit(cfg)` (`python -m exgrpo.run --dry-run`) checks the run's plan against the one a
run would use, as a start does (`exgrpo.runtime.resources.shortfalls`).
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

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


def cluster_totals(address: str) -> tuple[dict[str, float], list[dict[str, float]]]:
    """The total resources and alive nodes of the running cluster at `address` (connects as a driver,
    starts no actor, disconnects).

    A `host:port` address is first probed (`probe_address`). Raises ConnectionError when nothing answers.
    """
    probe_address(address)
    import ray

    ray.init(address=address, namespace="exgrpo", configure_logging=False, log_to_driver=False)
    try:
        return dict(ray.cluster_resources()), alive_nodes(ray)
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
    if address:
        try:
            total, nodes = cluster_totals(address)
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
    return (
        f"fits {where}: the plan needs {plan.cpus:g} of {total.get('CPU', 0):g} CPUs and "
        f"{plan.gpus:g} of {total.get('GPU', 0):g} GPUs"
    )
