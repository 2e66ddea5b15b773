"""`python -m exgrpo.scale --samplers N`: grow or shrink the samplers of a running job.

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

from exgrpo.core.names import CONTROLLER, NAMESPACE
from exgrpo.runtime.clusters import probe_address
from exgrpo.runtime.resources import samplers_that_fit


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m exgrpo.scale", description=__doc__.split("\n")[0])
    parser.add_argument("--samplers", type=int, required=True, help="desired number of sampler actors (>= 1)")
    parser.add_argument("--address", default="auto", help="Ray cluster address (default: auto / RAY_ADDRESS)")
    args = parser.parse_args(argv)
    if args.samplers < 1:
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
    try:
        controller = ray.get_actor(CONTROLLER, namespace=NAMESPACE)
    except ValueError:
        print(
            "error: no running exgrpo job found (actor 'exgrpo-controller' in namespace 'exgrpo')",
            file=sys.stderr,
        )
        return 1
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


if __name__ == "__main__":
    sys.exit(main())
