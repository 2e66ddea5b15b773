"""The names of the job's Ray actors, defined once (the Ray dashboard, `ray.get_actor` and the placement plan
use them): `exgrpo-sampler-<i>`, `exgrpo-replay-<i>`, `exgrpo-learner-<i>`, `exgrpo-controller`, in
namespace `exgrpo`."""

from __future__ import annotations

NAMESPACE = "exgrpo"
CONTROLLER = "exgrpo-controller"


def sampler_name(index: int) -> str:
    """The actor name of the sampler spawned with `index`; also its stable id in the pool."""
    return f"exgrpo-sampler-{index}"


def replay_name(index: int) -> str:
    return f"exgrpo-replay-{index}"


def learner_name(rank: int) -> str:
    return f"exgrpo-learner-{rank}"
