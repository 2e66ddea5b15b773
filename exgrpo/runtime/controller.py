"""The scaling controller: the job's named actor `exgrpo-controller` holding the operator's desired sampler count.

`ControllerClient` is how the driver reads it (`exgrpo.core.roles.Scaling`) without blocking;
`python -m exgrpo.scale --samplers N` sets it.
"""

from __future__ import annotations

from typing import Any

from exgrpo.core.faults import fault_point


class Controller:
    """The named actor `exgrpo-controller` through which operators steer a running job."""

    def __init__(self, *, samplers: int, sampler_cpus: float = 0.0, sampler_gpus: float = 0.0) -> None:
        self._samplers = samplers
        self._resources = (float(sampler_cpus), float(sampler_gpus))  # what one more sampler reserves

    def ping(self) -> str:
        return "pong"

    def set_samplers(self, *, n: int) -> int:
        if n < 1:
            raise ValueError(f"samplers must be >= 1, got {n}")
        self._samplers = n
        return n

    def desired_samplers(self) -> int:
        fault_point("controller.desired_samplers")
        return self._samplers

    def sampler_resources(self) -> tuple[float, float]:
        """(CPUs, GPUs) one sampler actor reserves (`samplers.num_cpus`, `samplers.num_gpus`)."""
        return self._resources


class ControllerClient:
    """`exgrpo.core.roles.Scaling` over the controller actor without blocking: one query is always in
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
