"""The one place that applies ``ray.remote`` to the plain role classes.

Roles (Learner, Sampler, ReplayShard, ...) are plain classes; the wiring passes ``remote_actor`` to
whoever creates actors (e.g. ``LearnerGroup(make_actor=remote_actor, ...)``), so tests can run every
role in-process and the actor options live here.
"""

from __future__ import annotations

from typing import Any

import ray


def remote_actor(
    cls: type,
    *,
    name: str,
    num_cpus: float,
    num_gpus: float = 0,
    scheduling_strategy: Any = None,
    max_restarts: int = 0,
    max_concurrency: int = 1,
    **init_kwargs: Any,
) -> ray.actor.ActorHandle:
    """Start ``cls(**init_kwargs)`` as a named Ray actor and return its handle.

    ``name`` is the actor's name in the Ray dashboard (e.g. ``exgrpo-learner-0``); ``scheduling_strategy``
    places it (e.g. a ``PlacementGroupSchedulingStrategy`` bundle); ``max_concurrency`` > 1 lets it serve
    calls from several threads.
    """
    options: dict[str, Any] = {
        "name": name,
        "num_cpus": num_cpus,
        "num_gpus": num_gpus,
        "max_restarts": max_restarts,
        "max_concurrency": max_concurrency,
    }
    if scheduling_strategy is not None:
        options["scheduling_strategy"] = scheduling_strategy
    return ray.remote(cls).options(**options).remote(**init_kwargs)
