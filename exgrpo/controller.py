"""Controller: the named actor `exgrpo-controller` through which operators steer a running job.

`python -m exgrpo.scale --samplers N` sets the desired sampler count; the driver reads it at the
start of every step and grows or drains the sampler pool (learners are not affected).
"""

from __future__ import annotations


class Controller:
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
