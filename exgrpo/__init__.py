"""ExGRPO (learning to reason from experience) as a Ray actor-learner system.

Packages: `exgrpo` (algorithm, config, rewards, data, driver, entry points), `actors` (samplers and
engines), `buffers` (experience pool and replay shards), `learners` (DeepSpeed learner group and
weight sync). See docs/architecture.md.

`from exgrpo import train` is the Python entry point (`exgrpo.api.train`; README, "Python API"); it is
imported on first use, so `import exgrpo` stays light for the worker processes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from exgrpo.api import RunResult, train

__all__ = ["RunResult", "train"]


def __getattr__(name: str) -> Any:
    if name in ("train", "RunResult"):
        from exgrpo import api

        return getattr(api, name)
    raise AttributeError(f"module 'exgrpo' has no attribute {name!r}")
