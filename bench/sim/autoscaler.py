"""Ray's real autoscaler on one machine (the fake multi-node provider): a head and `sampler` worker nodes that
are raylets on this host, for the elastic tests and `bench/system/bench_elastic.py --autoscaler`.

`FakeAutoscaler` starts and stops only its own processes (never `ray stop`); `kill_node` SIGKILLs a node's raylet,
`drain_node` drains one as a spot notice does. Its settings: docs/benchmarks.md, "Simulated cluster".
Tests: tests/integration/test_elastic_autoscaler.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

from exgrpo.transport.ranks import free_port

HEAD_TYPE = "ray.head.default"
ROOT = Path(__file__).resolve().parents[2]  # the checkout: bench/ is not installed with the package


class FakeAutoscaler:
    def __init__(
        self,
        *,
        max_workers: int = 4,
        idle_timeout_minutes: float = 0.1,
        node_cpus: int = 1,
        head_cpus: int = 0,
    ) -> None:
        self.head_cpus = head_cpus
        self.port = free_port("127.0.0.1")
        self.address = f"127.0.0.1:{self.port}"
        self.temp_dir = tempfile.mkdtemp(prefix=f"exa{self.port}-", dir="/tmp")
        self._monitor: psutil.Process | None = None  # the autoscaler's monitor (`node_processes`)
        self.config = {
            "cluster_name": f"exgrpo-fake-{self.port}",
            "max_workers": max_workers,
            "upscaling_speed": 10.0,
            "idle_timeout_minutes": idle_timeout_minutes,
            "provider": {  # Ray's fake multi-node provider that sees a killed node go (fake_provider.py)
                "type": "external",
                "module": "bench.sim.fake_provider.KillAwareProvider",
                "gcs_address": self.address,
                "use_node_id_as_ip": True,  # else the autoscaler never sees its nodes heartbeat and kills them
                "disable_node_updaters": True,  # else an updater (ssh) "fails" on each new node, which is killed
                "disable_launch_config_check": True,
                "launch_multiple": True,
            },
            "auth": {"ssh_user": "ubuntu"},
            "docker": {},
            "head_node_type": HEAD_TYPE,
            "available_node_types": {
                HEAD_TYPE: {"resources": {"CPU": head_cpus}, "node_config": {}, "max_workers": 0},
                "sampler": {
                    "resources": {"CPU": node_cpus, "sampler_node": 1, "object_store_memory": 100 * 1024**2},
                    "node_config": {},
                    "min_workers": 0,
                    "max_workers": max_workers,
                },
            },
            "file_mounts": {},
            "cluster_synced_files": [],
            "file_mounts_sync_continuously": False,
            "rsync_exclude": [],
            "rsync_filter": [],
            "initialization_commands": [],
            "setup_commands": [],
            "head_setup_commands": [],
            "worker_setup_commands": [],
            "head_start_ray_commands": [],
            "worker_start_ray_commands": [],
        }
        self.events: list[tuple[float, str]] = []  # (seconds since start, what happened)
        self.t0 = time.monotonic()

    def note(self, what: str) -> None:
        self.events.append((round(time.monotonic() - self.t0, 1), what))

    def start(self) -> None:
        path = Path(self.temp_dir) / "cluster.json"
        path.write_text(json.dumps(self.config))
        env = {
            **os.environ,
            "RAY_FAKE_CLUSTER": "1",
            "AUTOSCALER_UPDATE_INTERVAL_S": "1",
            "RAY_AUTH_MODE": "disabled",
            # the autoscaler's monitor imports the provider (bench/sim/fake_provider.py) from the checkout
            "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p),
        }
        ray_bin = str(Path(sys.executable).with_name("ray"))
        cmd = [
            ray_bin, "start", "--head", "--node-ip-address=127.0.0.1", f"--port={self.port}",
            f"--autoscaling-config={path}", f"--temp-dir={self.temp_dir}", f"--num-cpus={self.head_cpus}", f"--object-store-memory={200 * 1024**2}",
            "--include-dashboard=false", "--disable-usage-stats", f"--ray-client-server-port={free_port('127.0.0.1')}",
        ]  # fmt: skip
        subprocess.run(cmd, env=env, check=True, capture_output=True, timeout=120)
        self.t0 = time.monotonic()
        self.note("head started")

    def worker_nodes(self) -> list[dict[str, Any]]:
        import ray

        return [n for n in ray.nodes() if n["Alive"] and n["Resources"].get("sampler_node")]

    def wait_nodes(self, n: int, *, timeout_s: float = 120.0, at_most: bool = False) -> float:
        """Until exactly (at_most: at most) n worker nodes are alive; the seconds it took."""
        t = time.monotonic()
        while time.monotonic() - t < timeout_s:
            live = len(self.worker_nodes())
            if live == n or (at_most and live <= n):
                return time.monotonic() - t
            time.sleep(0.5)
        raise TimeoutError(f"{len(self.worker_nodes())} worker nodes after {timeout_s:.0f} s, wanted {n}")

    def node_processes(self) -> list[psutil.Process]:
        """Every process of the launched worker nodes (raylets, their agents and workers): the autoscaler's
        monitor starts each node's processes, so they are its descendants."""
        with contextlib.suppress(psutil.Error):  # a process that exits while listed is simply not counted
            if self._monitor is None or not self._monitor.is_running():
                self._monitor = next(
                    (p for p in self._procs() if "autoscaler/_private/monitor.py" in " ".join(p.cmdline())),
                    None,
                )
            return self._monitor.children(recursive=True) if self._monitor is not None else []
        return []

    def _procs(self) -> list[psutil.Process]:
        out = []
        for p in psutil.process_iter(["cmdline"]):
            cmd = " ".join(p.info["cmdline"] or [])
            if (
                self.address in cmd
                or self.temp_dir in cmd
                or f"--gcs_server_port={self.port}" in cmd
                or (
                    "ray" in cmd and f":{self.port} " in cmd + " "
                )  # e.g. the client server, on the machine's IP
            ):
                out.append(p)
        return out

    def kill_node(self, node_id: str) -> None:
        """SIGKILL the raylet of node `node_id` (and its workers): a node that vanishes without notice."""
        victims = [
            p for p in psutil.process_iter(["cmdline"]) if node_id in " ".join(p.info["cmdline"] or [])
        ]
        for p in victims:
            for child in p.children(recursive=True):
                child.kill()
            p.kill()
        self.note(f"killed node {node_id[-5:]} ({len(victims)} processes)")

    def drain_node(self, node_id: str, *, deadline_s: float) -> bool:
        import ray
        from ray._raylet import GcsClient  # type: ignore[attr-defined]
        from ray.core.generated import autoscaler_pb2

        client = GcsClient(address=ray.get_runtime_context().gcs_address)
        accepted, why = client.drain_node(
            node_id,
            autoscaler_pb2.DrainNodeReason.DRAIN_NODE_REASON_PREEMPTION,
            "spot notice (test)",
            int((time.time() + deadline_s) * 1000),
        )
        self.note(f"drained node {node_id[-5:]} with a {deadline_s:g} s deadline (accepted={accepted} {why})")
        return bool(accepted)

    def stop(self) -> None:
        procs = self._procs()
        for p in procs:
            with contextlib.suppress(psutil.Error):
                p.send_signal(signal.SIGTERM)
        _, alive = psutil.wait_procs(procs, timeout=3)
        for p in alive:
            with contextlib.suppress(psutil.Error):
                p.kill()
        shutil.rmtree(self.temp_dir, ignore_errors=True)
