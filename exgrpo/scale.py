"""`python -m exgrpo.scale`: the exgrpo jobs on the Ray clusters it can see, and their samplers (read-only); with
`--samplers N` or `--auto`, resize the one job named by `--job` (or the only one there is).

    python -m exgrpo.scale                                  # status: each job, its id and its sampler count
    python -m exgrpo.scale --job 10.0.0.5:6379/02000000 --samplers 4   # a fixed count (the policy off)
    python -m exgrpo.scale --job 10.0.0.5:6379/02000000 --auto         # hand the count back to the policy

It looks at the cluster at --address, else RAY_ADDRESS, else every Ray cluster running on this machine, and
finds each job by its named controller actor `exgrpo-controller` (namespace `exgrpo`,
`exgrpo/runtime/controller.py`). A change without --job is refused, listing the jobs, when more than one is
visible; nothing changes in status mode or on a refusal. New samplers receive the current weights before their
first rollout; removed ones finish their in-flight requests first, so no request is lost. A scale-up the
cluster cannot place now is refused at once (exit 2) with the count that fits, since a sampler Ray cannot
place would wait for resources forever (`EXGRPO_SKIP_RESOURCE_CHECK=1` skips the check, e.g. on an
autoscaling cluster that adds nodes on demand).
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from typing import Any

from exgrpo.core.names import CONTROLLER, NAMESPACE
from exgrpo.runtime.clusters import probe_address
from exgrpo.runtime.resources import samplers_that_fit


@dataclass(frozen=True)
class Job:
    """One exgrpo job as the status lists it."""

    address: str  # the Ray cluster it runs on
    job_id: str  # Ray's job id ("02000000"), what --job takes; "?" when Ray's tables do not say
    driver: str  # "driver pid N on IP: entrypoint"
    samplers: int
    auto: bool  # samplers.autoscale's policy sets the count now

    @property
    def key(self) -> str:
        """What --job takes: `ADDRESS/JOB_ID` (Ray numbers each cluster's jobs from 01000000), or the bare id
        where it is unique among the jobs seen."""
        return f"{self.address}/{self.job_id}"

    def label(self) -> str:
        return f"exgrpo job {self.key} ({self.driver})"

    def line(self) -> str:
        mode = "set by the autoscale policy" if self.auto else "a fixed count"
        count = f"{self.samplers} sampler{'s' if self.samplers != 1 else ''}"
        return f"  {self.key}: {count} ({mode}); {self.driver}"

    def named(self, wanted: str) -> bool:
        return wanted.lower() in (self.key.lower(), self.job_id.lower())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m exgrpo.scale",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--samplers", type=int, help="set the job's sampler count (>= 1); fixes the count")
    mode.add_argument(
        "--auto", action="store_true", help="hand the count back to the run's policy (samplers.autoscale)"
    )
    parser.add_argument(
        "--job",
        help="the job to change, as the status lists it: ADDRESS/JOB_ID, or JOB_ID alone where no other job "
        "seen has it (e.g. 02000000)",
    )
    parser.add_argument(
        "--address",
        default="auto",
        help="Ray cluster address (default: RAY_ADDRESS, else every Ray cluster running on this machine)",
    )
    args = parser.parse_args(argv)
    if args.samplers is not None and args.samplers < 1:
        parser.error("--samplers must be >= 1")
    import ray

    if args.job and "/" in args.job and args.address == "auto":  # ADDRESS/JOB_ID: look on that cluster
        args.address = args.job.rpartition("/")[0]
    jobs = visible_jobs(ray, addresses(args.address))
    if jobs is None:
        return 2
    if args.samplers is None and not args.auto:
        return status(jobs, args.job)
    job = pick(jobs, args.job)
    if job is None:
        return 2
    ray.init(address=job.address, namespace=NAMESPACE, logging_level="ERROR")
    try:
        return change(ray, job, args.samplers)
    finally:
        ray.shutdown()


def addresses(address: str) -> list[str]:
    """The clusters to look at: --address, else RAY_ADDRESS, else each local cluster's GCS (else "auto")."""
    if address != "auto" or os.environ.get("RAY_ADDRESS"):
        return [address]
    from ray._private.services import find_gcs_addresses

    return sorted(find_gcs_addresses()) or ["auto"]


def visible_jobs(ray: Any, where: list[str]) -> list[Job] | None:
    """The exgrpo jobs on the clusters at `where`; None (after an error line) when none of them answers."""
    jobs, reached, errors = [], 0, []
    for address in where:
        try:
            probe_address(address)
            ray.init(address=address, namespace=NAMESPACE, logging_level="ERROR")
        except (
            ConnectionError,
            ValueError,
            RuntimeError,
        ) as err:  # nothing listens there, a malformed address
            errors.append(f"{address}: {err}")
            continue
        reached += 1
        try:
            jobs += jobs_here(ray, ray.get_runtime_context().gcs_address if address == "auto" else address)
        finally:
            ray.shutdown()
    if reached == 0:
        where_text = "RAY_ADDRESS / a running local cluster" if where == ["auto"] else ", ".join(where)
        print(
            f"error: cannot reach a Ray cluster at {where_text} ({'; '.join(errors)}); start the job's cluster "
            "first (ray start --head) or pass its --address",
            file=sys.stderr,
        )
        return None
    return jobs


def jobs_here(ray: Any, address: str) -> list[Job]:
    """The exgrpo job on the cluster ray is attached to (one controller per cluster: its name is fixed)."""
    try:
        controller = ray.get_actor(CONTROLLER, namespace=NAMESPACE)
    except ValueError:
        return []
    samplers, auto = ray.get(controller.state.remote())
    job_id, driver = describe_job()
    return [Job(address=address, job_id=job_id, driver=driver, samplers=int(samplers), auto=bool(auto))]


def status(jobs: list[Job], wanted: str | None) -> int:
    """The read-only listing (no --samplers / --auto): nothing is changed."""
    shown = [j for j in jobs if wanted is None or j.named(wanted)]
    if not shown:
        print(
            "no exgrpo job" + (f" {wanted}" if wanted else "") + " on the Ray clusters seen; nothing to show"
        )
        return 0 if wanted is None else 2
    print(f"{len(shown)} exgrpo job{'s' if len(shown) != 1 else ''} (read-only; nothing was changed):")
    print("\n".join(j.line() for j in shown))
    print("change one: python -m exgrpo.scale --job ADDRESS/JOB_ID --samplers N (or --auto)")
    return 0


def pick(jobs: list[Job], wanted: str | None) -> Job | None:
    """The job to change: the one --job names, or the only one visible; None (after an error line) otherwise."""
    listing = "\n".join(j.line() for j in jobs)
    if wanted is not None:
        match = [j for j in jobs if j.named(wanted)]
        if len(match) == 1:
            return match[0]
        if match:
            print(
                f"error: --job {wanted} names {len(match)} jobs (on different clusters), nothing was changed; "
                "give ADDRESS/JOB_ID:\n" + "\n".join(j.line() for j in match),
                file=sys.stderr,
            )
            return None
        seen = f"; the jobs seen:\n{listing}" if jobs else ": no exgrpo job is running there"
        print(
            f"error: no exgrpo job {wanted} on the Ray clusters seen, nothing was changed{seen}",
            file=sys.stderr,
        )
        return None
    if not jobs:
        print(
            "error: the Ray clusters seen run no exgrpo job (no actor "
            f"{CONTROLLER!r} in namespace {NAMESPACE!r}); nothing was changed: pass the --address of the "
            "cluster that runs the job, or start the job first",
            file=sys.stderr,
        )
        return None
    if len(jobs) > 1:
        print(
            f"error: {len(jobs)} exgrpo jobs are visible and --job names none, so nothing was changed; "
            f"name one with --job ADDRESS/JOB_ID:\n{listing}",
            file=sys.stderr,
        )
        return None
    return jobs[0]


def change(ray: Any, job: Job, samplers: int | None) -> int:
    """Set `samplers` (or, None, hand the count back to the policy) on `job`, whose cluster ray is attached to."""
    print(f"found {job.label()}: {job.samplers} samplers now", flush=True)
    controller = ray.get_actor(CONTROLLER, namespace=NAMESPACE)
    if samplers is None:
        try:
            ray.get(controller.set_auto.remote())
        except ray.exceptions.RayTaskError as err:
            print(f"error: {err.cause if hasattr(err, 'cause') else err}", file=sys.stderr)
            return 2
        print(f"changed {job.label()}: handed the sampler count back to its autoscale policy (next step)")
        return 0
    current = int(ray.get(controller.desired_samplers.remote()))
    if samplers > current and not os.environ.get("EXGRPO_SKIP_RESOURCE_CHECK"):
        cpus, gpus = ray.get(controller.sampler_resources.remote())
        free = ray.available_resources()
        fit = samplers_that_fit(current=current, cpus=cpus, gpus=gpus, free=free)
        if samplers > fit:
            print(
                f"error: the cluster cannot place {samplers - current} more sampler(s) now: each reserves "
                f"{cpus:g} CPU and {gpus:g} GPU (samplers.num_cpus / num_gpus) and the cluster has "
                f"{free.get('CPU', 0.0):g} CPU and {free.get('GPU', 0.0):g} GPU free; at most {fit} samplers "
                f"fit (python -m exgrpo.scale --job {job.key} --samplers {fit}), or add nodes first; "
                "nothing was changed",
                file=sys.stderr,
            )
            return 2
    n = ray.get(controller.set_samplers.remote(n=samplers))
    print(f"changed {job.label()}: {current} -> {n} samplers; it applies the change at its next step")
    return 0


def ray_state() -> Any:
    """Ray's GCS tables (actors, jobs), read without the dashboard (a local exgrpo cluster runs none)."""
    from ray._private import state

    return state


def describe_job() -> tuple[str, str]:
    """The Ray job id of the cluster's live controller and `driver pid N on IP: entrypoint`."""
    try:
        tables = ray_state()
        alive = [
            a for a in tables.actors().values() if a.get("Name") == CONTROLLER and a.get("State") == "ALIVE"
        ]
        job_id = alive[0]["JobID"] if alive else None
        job = next((j for j in tables.jobs() if j.get("JobID") == job_id), None)
    except Exception:  # another Ray's tables: the job is still the one found, unnamed
        return "?", "driver unknown"
    if job_id is None or job is None:
        return str(job_id or "?"), "driver unknown"
    entry = f": {job['Entrypoint']}" if job.get("Entrypoint") else ""
    return str(job_id), f"driver pid {job.get('DriverPid')} on {job.get('DriverIPAddress')}{entry}"


if __name__ == "__main__":
    sys.exit(main())
