"""`python -m exgrpo.scale --samplers N`: grow or shrink the samplers of a running job.

The CLI reaches the job's named controller actor `exgrpo-controller` (namespace `exgrpo`,
`exgrpo/runtime/controller.py`) on the cluster at RAY_ADDRESS (or --address). New samplers receive the
current weights before their first rollout; removed ones finish their in-flight requests first, so no
request is lost.
"""

from __future__ import annotations

import argparse
import sys

from exgrpo.core.names import CONTROLLER, NAMESPACE


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m exgrpo.scale", description=__doc__.split("\n")[0])
    parser.add_argument("--samplers", type=int, required=True, help="desired number of sampler actors (>= 1)")
    parser.add_argument("--address", default="auto", help="Ray cluster address (default: auto / RAY_ADDRESS)")
    args = parser.parse_args(argv)
    if args.samplers < 1:
        parser.error("--samplers must be >= 1")
    import ray

    ray.init(address=args.address, namespace="exgrpo", logging_level="ERROR")
    try:
        controller = ray.get_actor(CONTROLLER, namespace=NAMESPACE)
    except ValueError:
        print(
            "error: no running exgrpo job found (actor 'exgrpo-controller' in namespace 'exgrpo')",
            file=sys.stderr,
        )
        return 1
    n = ray.get(controller.set_samplers.remote(n=args.samplers))
    print(f"asked the job for {n} samplers; it applies the change at its next step")
    return 0


if __name__ == "__main__":
    sys.exit(main())
