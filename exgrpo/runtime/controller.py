"""The scaling controller: the job's named actor `exgrpo-controller` holding the operator's desired sampler count.

`ControllerClient` is how the driver reads it (`exgrpo.core.roles.Scaling`) without blocking;
`python -m exgrpo.scale --samplers N` sets it. The controller holds nothing but that count (and whether the
run sizes its fleet itself, `samplers.autoscale`: `--samplers N` turns that off, `--auto` back on), so its
death stops nothing: the client starts a new one under the same name with the last count and mode it read.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from exgrpo.core.faults import fault_point


class Controller:
    """The named actor `exgrpo-controller` through which operators steer a running job."""

    def __init__(
        self,
        *,
        samplers: int,
        sampler_cpus: float = 0.0,
        sampler_gpus: float = 0.0,
        autoscale: bool = False,
        auto: bool | None = None,
    ) -> None:
        self._samplers = samplers
        self._autoscale = autoscale  # samplers.autoscale: the run has a policy to hand the count to
        self._auto = autoscale if auto is None else auto and autoscale  # the policy sets the count now
        self._resources = (float(sampler_cpus), float(sampler_gpus))  # what one more sampler reserves

    def ping(self) -> str:
        return "pong"

    def set_samplers(self, *, n: int) -> int:
        if n < 1:
            raise ValueError(f"samplers must be >= 1, got {n}")
        self._samplers = n
        self._auto = False  # an operator's count holds until --auto
        return n

    def set_auto(self) -> bool:
        """Hand the count back to the run's policy (`python -m exgrpo.scale --auto`)."""
        if not self._autoscale:
            raise ValueError("this run has no autoscale policy (samplers.autoscale=false)")
        self._auto = True
        return True

    def state(self) -> tuple[int, bool]:
        """(the operator's count, whether the policy sets the count instead)."""
        return self.desired_samplers(), self._auto

    def desired_samplers(self) -> int:
        fault_point("controller.desired_samplers")
        return self._samplers

    def sampler_resources(self) -> tuple[float, float]:
        """(CPUs, GPUs) one sampler actor reserves (`samplers.num_cpus`, `samplers.num_gpus`)."""
        return self._resources


class ControllerClient:
    """`exgrpo.core.roles.Scaling` over the controller actor without blocking: one query is always in
    flight; `desired_samplers()` returns its answer once it has arrived (and asks again), else None.

    A controller that died (its query fails with a `RayActorError`) is replaced: ``start(n)`` makes a new
    one holding ``n``, the last count this client read (the operator's setting unless it changed after that
    read; then ``exgrpo.scale`` sets it again on the new controller), and the run goes on.
    """

    def __init__(
        self,
        handle: Any,
        *,
        start: Callable[..., Any] | None = None,
        samplers: int = 1,
        auto: bool = False,
    ) -> None:
        self.handle, self._start, self._last = handle, start, samplers
        self.auto = auto  # whether the run's autoscale policy sets the count (the last state read)
        self.replaced = 0  # controllers started after a death
        self._ref = handle.state.remote()

    def current(self, *, timeout_s: float = 5.0) -> int:
        """The controller's count now (one blocking query), or the last one read when it does not answer
        (dead, or busy for `timeout_s`): what a recovery starts with."""
        import ray

        try:
            self._last = int(ray.get(self.handle.desired_samplers.remote(), timeout=timeout_s))
        except (ray.exceptions.RayError, TimeoutError) as err:
            logging.getLogger("exgrpo").warning(
                "the controller did not answer (%s); keeping the last sampler count read, %d", err, self._last
            )
        return self._last

    def desired_samplers(self) -> int | None:
        import ray

        ready, _ = ray.wait([self._ref], timeout=0)
        if not ready:
            return None
        try:
            value, auto = ray.get(self._ref)
        except ray.exceptions.RayActorError:
            if self._start is None:
                raise
            self._replace()
            return None
        self._last, self.auto = int(value), bool(auto)
        self._ref = self.handle.state.remote()
        return self._last

    def _replace(self) -> None:
        import ray

        assert self._start is not None
        ray.kill(self.handle)  # it is dead; this frees its name should Ray not have done so yet
        self.handle = self._start(self._last, auto=self.auto)
        self.replaced += 1
        logging.getLogger("exgrpo").warning(
            "the controller died; started a new one holding %d samplers (the last count read; set it again "
            "with python -m exgrpo.scale if it changed since)",
            self._last,
        )
        self._ref = self.handle.state.remote()
