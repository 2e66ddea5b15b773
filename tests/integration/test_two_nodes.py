"""Two Ray "nodes" on this machine (two raylets, each with its own temp dir, ports and custom resource):

* placement: learner-side actors pinned to `node_a`, sampler-side actors to `node_b` (a test-only override
  through Ray's `resources=` option; the project itself places by CPU/GPU counts);
* the driver's network variables (GLOO_SOCKET_IFNAME, NCCL_*) reach every actor (`exgrpo.runtime.env.init_ray`
  attached through RAY_ADDRESS, as a cluster run is);
* the weight-transfer rendezvous across the two raylets: rank 0 (node_a) hosts the TCPStore as the gloo
  trainer engine does and picks its port itself; rank 1 (node_b) joins with only the (host, port) it was
  handed, and a broadcast arrives intact;
* a relative logging.run_dir is refused on this cluster.

The whole vLLM path over gloo is tests/integration/test_transports.py (one node); NCCL across hosts is GPU-only.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from exgrpo.transport import ranks

pytestmark = [pytest.mark.integration]  # the two-node test itself is also slow (about 85 s with its cluster)

RAY = str(Path(sys.executable).with_name("ray"))


def _free_port() -> int:
    return ranks.free_port("127.0.0.1")


def _stop(proc: subprocess.Popen) -> None:
    """End one `ray start --block` we started and everything in its session (never `ray stop`: that would
    end every Ray cluster on the machine)."""
    for sig, wait in ((signal.SIGTERM, 15), (signal.SIGKILL, 5)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=wait)
            return


@pytest.fixture(scope="module")
def two_nodes():
    import ray

    if ray.is_initialized():
        ray.shutdown()
    tmp = Path(tempfile.mkdtemp(prefix="exgrpo-2n-", dir="/tmp"))  # short: Ray's socket paths are limited
    port = _free_port()
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    env.pop("RAY_ADDRESS", None)
    common = ["--block", "--disable-usage-stats", "--num-gpus", "0", "--num-cpus", "2"]
    procs: list[subprocess.Popen] = []
    address = f"127.0.0.1:{port}"

    def start(args: list[str], log: str) -> None:
        out = open(tmp / log, "wb")  # noqa: SIM115 - closed with the process
        procs.append(
            subprocess.Popen(
                [RAY, "start", *args, *common],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )

    try:
        start(
            [
                "--head",
                f"--port={port}",
                "--resources",
                '{"node_a": 1}',
                f"--temp-dir={tmp / 'ray'}",
                "--include-dashboard=false",
                f"--ray-client-server-port={_free_port()}",
                f"--node-manager-port={_free_port()}",
                f"--object-manager-port={_free_port()}",
                "--min-worker-port=20000",
                "--max-worker-port=20999",
            ],
            "head.log",
        )
        deadline = time.time() + 90
        while (
            subprocess.run(
                [RAY, "status", f"--address={address}"], env=env, capture_output=True, timeout=60
            ).returncode
            != 0
        ):
            assert time.time() < deadline, (tmp / "head.log").read_text()[-3000:]
            time.sleep(1)
        start(
            [
                f"--address={address}",
                "--resources",
                '{"node_b": 1}',
                f"--node-manager-port={_free_port()}",
                f"--object-manager-port={_free_port()}",
                "--min-worker-port=21000",
                "--max-worker-port=21999",
            ],
            "worker.log",
        )
        yield {"address": address, "tmp": tmp}
    finally:
        if ray.is_initialized():
            ray.shutdown()
        for p in reversed(procs):
            _stop(p)
        shutil.rmtree(tmp, ignore_errors=True)


class Probe:
    """A stand-in role: where it runs, what it sees, and one side of a gloo weight world."""

    def where(self) -> dict:
        import ray

        return {
            "node": ray.get_runtime_context().get_node_id(),
            "env": {
                k: os.environ.get(k) for k in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "NCCL_IB_HCA")
            },
        }

    def host(self, world: int) -> int:
        """Rank 0 (the trainer engine's side): a TCPStore on an OS-chosen port of its own host."""
        from datetime import timedelta

        import torch.distributed as dist

        self.store = dist.TCPStore(
            "127.0.0.1", 0, world, is_master=True, timeout=timedelta(seconds=60), wait_for_workers=False
        )
        return int(self.store.port)

    def broadcast(self, port: int, rank: int, world: int) -> float:
        from datetime import timedelta

        import torch
        import torch.distributed as dist

        from exgrpo.transport.gloo import _broadcast, _gloo_group

        store = (
            self.store
            if rank == 0
            else dist.TCPStore("127.0.0.1", port, world, is_master=False, timeout=timedelta(seconds=60))
        )
        group = _gloo_group(store, name="exgrpo-weights-2n", rank=rank, world_size=world, timeout_s=60)
        t = torch.arange(1000, dtype=torch.float32) if rank == 0 else torch.zeros(1000)
        _broadcast(group, t)
        return float(t.sum())


@pytest.mark.slow
def test_two_nodes_placement_env_and_gloo_rendezvous(two_nodes, monkeypatch):
    import ray

    from exgrpo.core.config import Config, ConfigError
    from exgrpo.runtime.env import init_ray
    from exgrpo.runtime.run_dir import check_run_dir

    t0 = time.perf_counter()
    monkeypatch.setenv("RAY_ADDRESS", two_nodes["address"])
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "lo")  # as a 2-node run sets them (docs/operating.md)
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "lo")
    monkeypatch.setenv("NCCL_IB_HCA", "mlx5_0")
    monkeypatch.delenv("RAY_JOB_CONFIG_JSON_ENV_VAR", raising=False)
    cfg = Config()
    init_ray(cfg)
    deadline = time.time() + 90
    while len(nodes := [n for n in ray.nodes() if n.get("Alive")]) < 2:
        assert time.time() < deadline, (two_nodes["tmp"] / "worker.log").read_text()[-3000:]
        time.sleep(1)
    with pytest.raises(ConfigError, match="absolute path on storage every node shares"):
        check_run_dir(cfg, nodes=len(nodes))

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    ids = {n["Resources"].get("node_a") and "a" or "b": n["NodeID"] for n in nodes}
    actor = ray.remote(Probe)
    learner = actor.options(num_cpus=0.5, resources={"node_a": 0.1}).remote()
    samplers = [actor.options(num_cpus=0.5, resources={"node_b": 0.1}).remote() for _ in range(2)]
    try:
        seen = ray.get([a.where.remote() for a in [learner, *samplers]], timeout=120)
        assert seen[0]["node"] == ids["a"] and all(s["node"] == ids["b"] for s in seen[1:])
        for s in seen:
            assert s["env"] == {
                "GLOO_SOCKET_IFNAME": "lo",
                "NCCL_SOCKET_IFNAME": "lo",
                "NCCL_IB_HCA": "mlx5_0",
            }
        world = 3
        port = ray.get(learner.host.remote(world), timeout=60)  # picked on the sender only, handed over
        sums = ray.get(
            [learner.broadcast.remote(port, 0, world)]
            + [s.broadcast.remote(port, 1 + i, world) for i, s in enumerate(samplers)],
            timeout=120,
        )
        assert sums == [float(sum(range(1000)))] * 3
    finally:
        for a in [learner, *samplers]:
            ray.kill(a)
    print(f"two-node test body: {time.perf_counter() - t0:.1f} s")


def test_network_variables_are_picked_from_the_driver_environment():
    from exgrpo.runtime.env import network_env

    env = {
        "NCCL_SOCKET_IFNAME": "eth0",
        "GLOO_SOCKET_IFNAME": "eth0",
        "NCCL_IB_HCA": "mlx5",
        "HOME": "/x",
        "TP_SOCKET_IFNAME": "eth0",
        "PATH": "/bin",
    }
    assert network_env(env) == {k: v for k, v in env.items() if k not in ("HOME", "PATH")}


def test_a_relative_run_dir_is_refused_on_a_cluster(monkeypatch):
    import dataclasses

    from exgrpo.core.config import Config, ConfigError
    from exgrpo.runtime.run_dir import check_run_dir

    cfg = Config()
    cfg = dataclasses.replace(cfg, logging=dataclasses.replace(cfg.logging, run_dir="runs/x"))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.delenv("RAY_JOB_CONFIG_JSON_ENV_VAR", raising=False)
    check_run_dir(cfg)  # a private local cluster: fine
    with pytest.raises(ConfigError, match="2 nodes"):
        check_run_dir(cfg, nodes=2)
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    with pytest.raises(ConfigError, match="RAY_ADDRESS"):
        check_run_dir(cfg)
    cfg = dataclasses.replace(cfg, logging=dataclasses.replace(cfg.logging, run_dir="/shared/runs/x"))
    check_run_dir(cfg, nodes=2)
