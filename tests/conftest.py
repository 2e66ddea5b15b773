"""Shared fixtures: one real local Ray cluster per test module that asks for it."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(Path("~/.cache/exgrpo/torch_extensions").expanduser()))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ray_cluster():
    """A private local Ray cluster (4 logical CPUs on the 2-core machine) with a metrics port."""
    import ray

    from exgrpo.run import ACTOR_ENV

    port = free_port()
    ray.init(address="local", num_cpus=4, include_dashboard=False, namespace="exgrpo",
             runtime_env={"env_vars": ACTOR_ENV}, configure_logging=False, _metrics_export_port=port)
    yield {"metrics_port": port}
    ray.shutdown()
