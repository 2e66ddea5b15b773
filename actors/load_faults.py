"""Injected weight-load faults, for the tests of the weight checks (``exgrpo.loop.weight_checks``); test-only in effect.

``EXGRPO_LOAD_FAULT=[SAMPLER:]KIND[@VERSION]`` makes every object-store load of version >= VERSION (default 1) in
the sampler named SAMPLER (``sampler-0``; any sampler if omitted) go wrong, silently, as an engine bug would:

- ``noop``: the load does nothing but tag the engine with the new version (the weights stay the old ones);
- ``swap``: the load gets two same-shape matrices of different decoder layers exchanged (a wrong tensor).

Unset (every run but these tests), ``load_fault`` returns False at once. ``exgrpo.core.faults.fault_env`` copies the
variable into every actor, as it does ``EXGRPO_FAULTS``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import MutableMapping
from typing import Any

from exgrpo.core.faults import LOAD_FAULT_VAR, FaultSpecError
from exgrpo.transport.checksums import REST, layer_of

log = logging.getLogger(__name__)

KINDS = ("noop", "swap")


def parse(spec: str) -> tuple[str | None, str, int] | None:
    """(sampler or None, kind, first version) of an ``EXGRPO_LOAD_FAULT`` value; None when empty."""
    if not spec.strip():
        return None
    sampler, _, rest = spec.strip().rpartition(":")
    kind, _, version = rest.partition("@")
    if kind not in KINDS:
        raise FaultSpecError(f"{LOAD_FAULT_VAR}={spec!r}: unknown kind {kind!r}; known: {', '.join(KINDS)}")
    if version and not version.isdigit():
        raise FaultSpecError(f"{LOAD_FAULT_VAR}={spec!r}: the version must be an integer >= 0")
    return (sampler.removeprefix("exgrpo-") or None), kind, int(version or 1)


def load_fault(engine: Any, weights: MutableMapping[str, Any], *, version: int, sampler: str) -> bool:
    """Apply the armed fault to this load, if any: True when it took the load over (``noop``: the engine is only
    re-tagged), False when the caller loads ``weights`` (changed in place by ``swap``)."""
    armed = parse(os.environ.get(LOAD_FAULT_VAR, ""))
    if armed is None:
        return False
    who, kind, first = armed
    if version < first or (who is not None and who != sampler.removeprefix("exgrpo-")):
        return False
    if kind == "noop":
        log.warning("%s: injected fault: the load of version %d does nothing", sampler, version)
        engine._version = version
        return True
    a, b = _same_shape_pair(weights)
    log.warning("%s: injected fault: version %d loads %s and %s swapped", sampler, version, a, b)
    weights[a], weights[b] = weights[b], weights[a]
    return False


def _same_shape_pair(weights: MutableMapping[str, Any]) -> tuple[str, str]:
    """The first two matrices of the same shape in different decoder layers."""
    first: dict[tuple[int, ...], str] = {}
    for name, value in weights.items():
        shape = tuple(value.shape)
        if len(shape) < 2 or layer_of(name) == REST:
            continue
        other = first.setdefault(shape, name)
        if layer_of(other) != layer_of(name):
            return other, name
    raise FaultSpecError(f"{LOAD_FAULT_VAR}=swap: no two same-shape matrices in different layers to swap")
