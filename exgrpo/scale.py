"""`python -m exgrpo.scale --samplers N`: grow or shrink the samplers of a running job (a fixed count: the
autoscale policy, `samplers.autoscale`, stays off until `python -m exgrpo.scale --auto` hands the count back).

The CLI reaches the job's named controller actor `exgrpo-controller` (namespace `exgrpo`,
`exgrpo/runtime/controller.py`) on the cluster at RAY_ADDRESS (or --address). New samplers receive the
current weights before their first rollout; removed ones finish their in-flight requests first, so no
request is lost. A scale-up the cluster cannot place now is refused at once (exit 2) with the count that
fits, since a sampler Ray cannot place would wait for resources forever (`EXGRPO_SKIP_RESOURCE_CHECK=1`
skips the check, e.g. on an autoscaling cluster that adds nodes on demand).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from exgrpo.core.names import CONTROLLER, NAMESPACE
from exgrpo.runtime.clusters import probe_address
from exgrpo.runtime.resources import samplers_that_fit


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m exgrpo.scale", description=__doc__.split("\n")[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--samplers", type=int, help="desired number of sampler actors (>= 1); fixes the count")
    mode.add_argument(
        "--auto", action="store_true", help="hand the count back to the run's policy (samplers.autoscale)"
    )
    parser.add_argument("--address", default="auto", help="Ray cluster address (default: auto / RAY_ADDRESS)")
    args = parser.parse_args(argv)
    if args.samplers is not None and args.samplers < 1:
        parser.error("--samplers must be >= 1")
    import ray

    try:
        probe_address(args.address)
        ray.init(address=args.address, namespace="exgrpo", logging_level="ERROR")
    except (
        ConnectionError,
        ValueError,
        RuntimeError,
    ) as err:  # nothing listens there, or a malformed address
        where = "RAY_ADDRESS / a running local cluster" if args.address == "auto" else args.address
        print(
            f"error: cannot reach a Ray cluster at {where} ({err}); start the job's cluster first "
            "(ray start --head) or pass its --address",
            file=sys.stderr,
        )
        return 2
    controller = find_job(ray, "RAY_ADDRESS / the local cluster" if args.address == "auto" else args.address)
    if controller is None:
        return 2
    if args.auto:
        try:
            ray.get(controller.set_auto.remote())
        except ray.exceptions.RayTaskError as err:
            print(f"error: {err.cause if hasattr(err, 'cause') else err}", file=sys.stderr)
            return 2
        print("handed the sampler count back to the job's autoscale policy; it applies at its next step")
        return 0
    current = int(ray.get(controller.desired_samplers.remote()))
    if args.samplers > current and not os.environ.get("EXGRPO_SKIP_RESOURCE_CHECK"):
        cpus, gpus = ray.get(controller.sampler_resources.remote())
        free = ray.available_resources()
        fit = samplers_that_fit(current=current, cpus=cpus, gpus=gpus, free=free)
        if args.samplers > fit:
            print(
                f"error: the cluster cannot place {args.samplers - current} more sampler(s) now: each reserves "
                f"{cpus:g} CPU and {gpus:g} GPU (samplers.num_cpus / num_gpus) and the cluster has "
                f"{free.get('CPU', 0.0):g} CPU and {free.get('GPU', 0.0):g} GPU free; at most {fit} samplers "
                f"fit (python -m exgrpo.scale --samplers {fit}), or add nodes first",
                file=sys.stderr,
            )
            return 2
    n = ray.get(controller.set_samplers.remote(n=args.samplers))
    print(f"asked the job for {n} samplers; it applies the change at its next step")
    return 0


def find_job(ray: Any, where: str) -> Any:
    """The job's controller on the cluster ray is attached to, after printing which job it is; None (after an
    error line) when the cluster runs no exgrpo job: nothing is changed then."""
    try:
        controller = ray.get_actor(CONTROLLER, namespace=NAMESPACE)
    except ValueError:
        nodes = len([n for n in ray.nodes() if n.get("Alive")])
        cpus = ray.cluster_resources().get("CPU", 0.0)
        print(
            f"error: the Ray cluster at {where} ({nodes} node{'s' if nodes != 1 else ''}, {cpus:g} CPUs) runs no "
            f"exgrpo job (no actor {CONTROLLER!r} in namespace {NAMESPACE!r}); nothing was changed: pass the "
            "--address of the cluster that runs the job, or start the job first",
            file=sys.stderr,
        )
        return None
    current = int(ray.get(controller.desired_samplers.remote()))
    print(f"found {describe_job()} on the Ray cluster at {where}: {current} samplers now", flush=True)
    return controller


def ray_state() -> Any:
    """Ray's GCS tables (actors, jobs), read without the dashboard (a local exgrpo cluster runs none)."""
    from ray._private import state

    return state


def describe_job() -> str:
    """The exgrpo job whose controller was found: `exgrpo job <id> (driver pid N on IP: entrypoint)`."""
    try:
        tables = ray_state()
        alive = [
            a for a in tables.actors().values() if a.get("Name") == CONTROLLER and a.get("State") == "ALIVE"
        ]
        job_id = alive[0]["JobID"] if alive else None
        job = next((j for j in tables.jobs() if j.get("JobID") == job_id), None)
    except Exception:  # another Ray's tables: the job is still the one found, unnamed
        return "an exgrpo job"
    if job_id is None or job is None:
        return "an exgrpo job"
    entry = f": {job['Entrypoint']}" if job.get("Entrypoint") else ""
    return f"exgrpo job {job_id} (driver pid {job.get('DriverPid')} on {job.get('DriverIPAddress')}{entry})"


if __name__ == "__main__":
    sys.exit(main())
