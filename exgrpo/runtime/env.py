"""The Ray environment of a run: the actor environment, `init_ray` (attach or start a local cluster), and
`remote_actor`, the one place that applies ``ray.remote`` to the plain role classes.

Actors are named (`exgrpo-replay-<i>`, `exgrpo-sampler-<i>`, `exgrpo-learner-<i>`, `exgrpo-controller`) in
namespace `exgrpo`, so the Ray dashboard reads naturally.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import ray

from exgrpo.core.config import Config
from exgrpo.core.faults import fault_env
from exgrpo.runtime.clusters import local_cluster_cpus

# Environment every actor starts with (one torch thread per process: two on two cores made generation 5-70x slower; vLLM CPU
# settings: the in-process engine core, dropped by `init_ray` for GPU samplers).
ACTOR_ENV = {
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "TORCH_EXTENSIONS_DIR": os.environ.get(
        "TORCH_EXTENSIONS_DIR", str(Path("~/.cache/exgrpo/torch_extensions").expanduser())
    ),
    # This interpreter's bin first: DeepSpeed's op is built with the virtualenv's ninja however the run was
    # launched (a system ninja of another version makes the next start rebuild the op, ~23 s).
    "PATH": os.pathsep.join(
        p for p in (os.path.dirname(sys.executable), os.environ.get("PATH", os.defpath)) if p
    ),
}


# Quiet actors by default (`--verbose` / logging.verbose drops these): no per-actor "Loading weights" /
# "Writing model shards" bars (transformers and the HF hub honour HF_HUB_DISABLE_PROGRESS_BARS, tqdm
# TQDM_DISABLE), transformers' warnings off, Python warnings once per process, W&B silent. Ray's log
# deduplication (on by default) folds the same line from several actors into one.
QUIET_ENV = {
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "TQDM_DISABLE": "1",
    "TRANSFORMERS_VERBOSITY": "error",
    "PYTHONWARNINGS": "once",
    "WANDB_SILENT": "true",
    "EXGRPO_QUIET": "1",  # for role code that prints on its own (e.g. around deepspeed.initialize)
}


ACTOR_ENV.update(QUIET_ENV)


# Network settings a multi-node run sets in the driver's environment (docs/operating.md, "Two nodes"): which
# interface NCCL / gloo / torch's TCPStore bind to, InfiniBand and EFA choices. Ray does not forward the
# driver's environment to actors, so `init_ray` copies every variable with one of these prefixes (or names).
NETWORK_ENV_PREFIXES = (
    "NCCL_",
    "GLOO_",
    "TP_SOCKET_IFNAME",
    "UCX_",
    "FI_",
    "TORCH_NCCL_",
    "TORCH_DISTRIBUTED_",
)


def network_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The driver's network variables (NCCL_SOCKET_IFNAME, GLOO_SOCKET_IFNAME, NCCL_IB_*, ...) for every actor."""
    environ = os.environ if environ is None else environ
    return {k: v for k, v in environ.items() if k.startswith(NETWORK_ENV_PREFIXES)}


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

    ``name`` is the actor's name in the Ray dashboard; ``scheduling_strategy`` places it (e.g. a
    ``PlacementGroupSchedulingStrategy`` bundle); ``max_concurrency`` > 1 lets it serve calls from several threads.
    The driver's fault variables (`exgrpo.core.faults`: EXGRPO_FAULTS, EXGRPO_FAULTS_DIR), when set, are added
    to the actor's env (Ray merges them with the job's), read at the moment the actor is started.
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
    if faults := fault_env():
        options["runtime_env"] = {"env_vars": faults}
    # e.g. the sampler's weight-transfer calls (Ray takes concurrency groups at decoration, not in options)
    groups = getattr(cls, "CONCURRENCY_GROUPS", None)
    actor_cls = ray.remote(concurrency_groups=dict(groups))(cls) if groups else ray.remote(cls)
    return actor_cls.options(**options).remote(**init_kwargs)


class RayStartError(RuntimeError):
    """Ray did not start (or attach): the message names the cause and what to try (the CLI prints it, exit 2)."""


def _cause(err: BaseException) -> str:
    """The first line of Ray's own message, with its type when that says more than `Exception`."""
    text = (str(err).strip().splitlines() or [""])[0]
    kind = type(err).__name__
    return text if kind == "Exception" and text else f"{kind}: {text}" if text else kind


def local_start_failure(err: BaseException) -> str:
    """One line for a local cluster that did not start: Ray's cause, and what to try."""
    cause = _cause(err)
    slow = "timed out" in cause
    why = (
        "Ray's processes (GCS, raylet) did not come up within Ray's 30 s, usually because the machine is "
        "loaded; "
        if slow
        else ""
    )
    ray_tmp = os.environ.get("RAY_TMPDIR", "/tmp/ray")
    return (
        f"Ray could not start a local cluster: {cause} ({why}nothing was trained). Try: run the command "
        "again; free the machine (other jobs, memory, disk under /tmp); or start a cluster once with "
        "`RAY_AUTH_MODE=disabled ray start --head` and run with RAY_ADDRESS=127.0.0.1:6379; Ray's own logs: "
        f"{ray_tmp}/session_latest/logs"
    )


def init_ray(cfg: Config) -> dict[str, Any]:
    """Attach to RAY_ADDRESS if set (as under `ray job submit`), else start a private local cluster.

    `logging.dashboard` starts the local cluster's dashboard on `logging.dashboard_host` (127.0.0.1)
    and prints its URL; `logging.verbose` lets the actors' progress bars and warnings through.
    Returns {"dashboard_url", "metrics_port"} (None where unknown) and prints both lines when the
    dashboard is on. A cluster that does not start (or an address it cannot attach to) raises
    `RayStartError`, one line naming Ray's cause and what to try.
    """
    lc = cfg.logging
    env = {**ACTOR_ENV, **network_env()}
    if lc.verbose:
        for key in QUIET_ENV:
            env.pop(key, None)
    if cfg.samplers.num_gpus > 0:  # GPU vLLM samplers keep vLLM's engine-core process (CPU: in-process)
        env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
    if cfg.learners.num_gpus == 0 and cfg.samplers.num_gpus == 0:
        env.setdefault(
            "DS_ACCELERATOR", "cpu"
        )  # no GPU asked for: skips DeepSpeed's detection and its warning
    runtime_env = {"env_vars": env}
    if ray.is_initialized():
        ctx = None
    elif os.environ.get("RAY_ADDRESS"):
        # a job submitted with its own runtime env: Ray refuses env_vars keys set twice; the job's values win
        job = json.loads(os.environ.get("RAY_JOB_CONFIG_JSON_ENV_VAR") or "{}")
        for key in (job.get("runtime_env") or {}).get("env_vars") or {}:
            env.pop(key, None)
        address = os.environ["RAY_ADDRESS"]
        try:
            ctx = ray.init(runtime_env=runtime_env, namespace="exgrpo")
        except Exception as err:  # Ray raises bare Exception, ConnectionError, RuntimeError, TimeoutError...
            raise RayStartError(
                f"could not attach to the Ray cluster at RAY_ADDRESS={address}: {_cause(err)}; check that "
                "cluster (`ray status`), or unset RAY_ADDRESS to run on a local cluster"
            ) from err
    else:
        os.environ.setdefault(
            "RAY_AUTH_MODE", "disabled"
        )  # a private local cluster (docs/operating.md, "On a Ray cluster": token auth)
        dashboard = (
            {
                "include_dashboard": True,
                "dashboard_host": lc.dashboard_host,
                "dashboard_port": lc.dashboard_port,
            }
            if lc.dashboard
            else {"include_dashboard": False}
        )
        try:
            ctx = ray.init(
                address="local",
                num_cpus=local_cluster_cpus(cfg),
                runtime_env=runtime_env,
                namespace="exgrpo",
                configure_logging=False,
                log_to_driver=True,
                **dashboard,
            )
        except Exception as err:  # Ray raises bare Exception on a start-up timeout
            raise RayStartError(local_start_failure(err)) from err
    url = getattr(ctx, "dashboard_url", None) or None
    node = getattr(ray._private.worker.global_worker, "node", None)  # None when attached as a client
    port = getattr(node, "metrics_export_port", None)
    info = {
        "dashboard_url": f"http://{url}" if url and not url.startswith("http") else url,
        "metrics_port": port,
    }
    if lc.dashboard and ctx is not None:
        where = info["dashboard_url"] or "(none: this cluster runs no dashboard)"
        print(
            f"[exgrpo] Ray dashboard: {where}  (Jobs, Actors; charts need Prometheus + Grafana: "
            f"docs/operating.md)",
            file=sys.stderr,
            flush=True,
        )
        if port:
            print(
                f"[exgrpo] Prometheus target: 127.0.0.1:{port}/metrics (exgrpo_ series as ray_exgrpo_*)",
                file=sys.stderr,
                flush=True,
            )
    return info
