"""`python -m exgrpo.scale --samplers N`: grow or shrink the samplers of a running job.

`Controller` is the job's named actor `exgrpo-controller` holding the desired count;
`ControllerClient` is how the driver reads it (`exgrpo.core.Scaling`) without blocking. The CLI reaches
the job's named controller actor (namespace `exgrpo`) on the cluster at RAY_ADDRESS (or
--address). New samplers receive the current weights before their first rollout; removed ones
finish their in-flight requests first, so no request is lost.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any


class Controller:
    """The named actor `exgrpo-controller` through which operators steer a running job."""

    def __init__(self, *, samplers: int) -> None:
        self._samplers = samplers

    def ping(self) -> str:
        return "pong"

    def set_samplers(self, *, n: int) -> int:
        if n < 1:
            raise ValueError(f"samplers must be >= 1, got {n}")
        self._samplers = n
        return n

    def desired_samplers(self) -> int:
        return self._samplers


class ControllerClient:
    """`exgrpo.core.Scaling` over the controller actor without blocking: one query is always in
    flight; `desired_samplers()` returns its answer once it has arrived (and asks again), else None."""

    def __init__(self, handle: Any) -> None:
        self.handle = handle
        self._ref = handle.desired_samplers.remote()

    def desired_samplers(self) -> int | None:
        import ray

        ready, _ = ray.wait([self._ref], timeout=0)
        if not ready:
            return None
        value = ray.get(self._ref)
        self._ref = self.handle.desired_samplers.remote()
        return int(value)


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
        controller = ray.get_actor("exgrpo-controller", namespace="exgrpo")
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
