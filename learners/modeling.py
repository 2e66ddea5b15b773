"""The model as a learner rank loads it: dtype names, the torch.distributed start of one rank, and gradient
checkpointing with dropout forced off (so the first micro-batch's log-probs equal the proximal ones)."""

from __future__ import annotations

import contextlib
import datetime
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from exgrpo.core.config import LearnerConfig
from exgrpo.core.cores import Borrower, job_ledger
from exgrpo.core.precision import autocast_choice

DEFAULT_TORCH_EXTENSIONS_DIR = "~/.cache/exgrpo/torch_extensions"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def op_build_env() -> None:
    """Where DeepSpeed builds and finds the shared-memory comm op its first ``initialize`` loads:
    ``TORCH_EXTENSIONS_DIR`` (default ``DEFAULT_TORCH_EXTENSIONS_DIR``), built with this interpreter's ninja
    (its bin first on PATH, as the actors get it from ``exgrpo.runtime.env.ACTOR_ENV``). A ninja of another
    version (Debian's 1.11 beside the wheel's 1.13) does not take the other's build log and compiles the op
    again, 30-90 s on 2 cores, each time the two alternate: measured in the test suite, where learners in
    the test process and learners in Ray actors loaded it in turn, six times in one run."""
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", os.path.expanduser(DEFAULT_TORCH_EXTENSIONS_DIR))
    clear_stale_build_lock(os.path.join(os.environ["TORCH_EXTENSIONS_DIR"], "deepspeed_shm_comm", "lock"))
    here = os.path.dirname(sys.executable)
    path = os.environ.get("PATH", os.defpath)
    if path.split(os.pathsep)[0] != here:
        os.environ["PATH"] = os.pathsep.join((here, path))


STALE_LOCK_S = 600.0  # a build of the op takes 30-90 s on 2 cores


def clear_stale_build_lock(lock: str, *, stale_s: float = STALE_LOCK_S) -> bool:
    """Remove torch's extension-build lock file when it is older than ``stale_s`` (its builder was killed
    mid-build: torch waits for the file to go, forever); says so on stderr. Returns whether it removed it."""
    try:
        age = time.time() - os.path.getmtime(lock)
    except OSError:
        return False
    if age < stale_s:
        return False
    with contextlib.suppress(FileNotFoundError):
        os.remove(lock)
    print(
        f"[exgrpo] removed {lock}, a build lock {age:.0f} s old (its build was killed part-way); "
        "DeepSpeed builds its op again",
        file=sys.stderr,
        flush=True,
    )
    return True


def packing_choice(setting: str, *, device: torch.device, model: torch.nn.Module) -> tuple[bool, str]:
    """(whether rows sharing a prompt run as one sequence, the clause that says so) for ``learners.pack_prompts``
    (``learners.batches.packed``): auto packs on CPU learners, where the matmuls are the update's time and a
    group's K rows would otherwise compute their prompt K times. Needs the model's SDPA attention (a boolean
    (S, S) mask) and position ids; ``on`` without them is refused."""
    impl = getattr(getattr(model, "config", None), "_attn_implementation", None)
    if setting == "off" or (setting == "auto" and device.type != "cpu"):
        return False, f"one row a sequence, padded (learners.pack_prompts={setting})"
    if impl != "sdpa":
        if setting == "on":
            raise ValueError(
                f"learners.pack_prompts=on needs the model's attention to be sdpa (a boolean (S, S) mask), "
                f"this model's is {impl!r}: set learners.pack_prompts=off"
            )
        return False, f"one row a sequence, padded (learners.pack_prompts=auto: {impl} attention)"
    return (
        True,
        f"a group's rows packed in one sequence, its prompt computed once (learners.pack_prompts={setting})",
    )


def ray_ledger() -> Path | None:
    """This Ray actor's core ledger (``exgrpo.core.cores.job_ledger``); None outside a Ray actor (ray imported
    lazily: the learner imports without it). A learner built in a driver that happens to have Ray initialised
    (a notebook, a test process) keeps its own threads: varying them would change its results' last bits."""
    try:
        import ray
    except ImportError:
        return None
    if not ray.is_initialized():
        return None
    ctx = ray.get_runtime_context()
    if ctx.get_actor_id() is None:
        return None
    return job_ledger(ctx.get_job_id(), ctx.get_node_id())


@dataclass(frozen=True)
class ComputePlan:
    """How a learner rank computes, decided at start-up from its settings, device and CPU (``compute_plan``)."""

    autocast: bool  # CPU bfloat16 autocast (``autocast_choice``)
    pack: bool  # a group's rows in one sequence (``packing_choice``)
    threads: Borrower | None  # torch threads sized to the node's idle sampler cores (``exgrpo.core.cores``)
    sentence: str  # all of it in words, printed at start-up


def compute_plan(
    cfg: LearnerConfig, *, device: torch.device, dtype: str, model: torch.nn.Module
) -> ComputePlan:
    """The ``ComputePlan`` of a rank: ``learners.autocast``, ``learners.pack_prompts`` and, on a CPU learner in a
    Ray job, ``learners.borrow_idle_cores``."""
    chunked = cfg.logits_chunk_tokens is not None
    autocast, compute = autocast_choice(cfg.autocast, device=device, dtype=dtype, chunked=chunked)
    pack, packing = packing_choice(cfg.pack_prompts, device=device, model=model)
    own = max(1, int(cfg.num_cpus))
    ledger = ray_ledger() if device.type == "cpu" and cfg.borrow_idle_cores else None
    threads = None if ledger is None else Borrower(ledger, own=own, set_threads=torch.set_num_threads)
    borrow = f"{own} thread(s)"
    if threads is not None:
        borrow += (
            f", up to {threads.limit} while this node's CPU samplers are idle (learners.borrow_idle_cores)"
        )
    return ComputePlan(autocast, pack, threads, f"{compute}; {packing}; {borrow}")


DROPOUT_FIELDS = (
    "attention_dropout",
    "hidden_dropout",
    "resid_pdrop",
    "embd_pdrop",
    "attn_pdrop",
    "dropout",
    "hidden_dropout_prob",
    "attention_probs_dropout_prob",
    "activation_dropout",
)


def checkpointing_on(setting: str, device: torch.device) -> bool:
    """``learners.gradient_checkpointing``: "on", "off", or "auto" = on exactly for a CUDA learner."""
    return setting == "on" or (setting == "auto" and device.type == "cuda")


def set_checkpointing(model: Any, on: bool) -> None:
    """Gradient checkpointing on or off, keeping old_logp == logp at the first micro-batch.

    Off: ``model.eval()`` (dropout off). On: transformers recomputes only in train mode, so the model is
    put in ``train()`` with non-reentrant checkpointing; the rule is that train mode must be
    deterministic, so every dropout probability of the model's config (``DROPOUT_FIELDS``) and every
    ``torch.nn.Dropout`` module are forced to 0 (Qwen2/Llama have none; a model with dropout > 0 trains
    without it, as it does in eval mode without checkpointing)."""
    if not on:
        model.eval()
        return
    for field in DROPOUT_FIELDS:
        if getattr(model.config, field, None):
            setattr(model.config, field, 0.0)
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
        if hasattr(module, "attention_dropout") and isinstance(module.attention_dropout, float):
            module.attention_dropout = 0.0
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()


def forget_deepspeed_groups(*, only_stale: bool = False) -> None:
    """Drop the groups DeepSpeed cached from an earlier torch.distributed world of this process (``only_stale``:
    only when its cached world group is no longer one of the current world's). A world that another library
    destroyed (an in-process vLLM engine's shutdown destroys it, and its next start makes a new one) leaves
    DeepSpeed holding its groups, and the next ``deepspeed.initialize`` fails on them ("Group ... is not
    registered"); DeepSpeed's own teardown calls the same release. Only processes that host more than one
    engine meet this (tests, notebooks): a learner actor starts one world."""
    groups = sys.modules.get("deepspeed.utils.groups")  # None until this process has imported DeepSpeed
    if groups is None:
        return
    if only_stale:
        cached = getattr(groups, "_WORLD_GROUP", None)
        if cached is None or in_current_world(cached):
            return
    groups._release_process_group_references(None)


def in_current_world(group: Any) -> bool:
    """Whether ``group`` belongs to the current torch.distributed world: torch keeps the ranks of every group
    of its world and forgets them all when the world is destroyed, so a group of an earlier world has none
    (`torch.distributed.get_process_group_ranks` raises KeyError for it)."""
    try:
        dist.get_process_group_ranks(group)
    except KeyError:
        return False
    return True


def deepspeed_world_group(timeout_s: float) -> None:
    """Give DeepSpeed its copy of the world group, with our timeout. ZeRO's collectives (stage 3's gathers,
    stage 2's reductions) run in that copy, which DeepSpeed otherwise makes with `dist.new_group` and torch's
    default timeout for the backend (NCCL 10 minutes, gloo 30), not the one `init_process_group` was given."""
    from deepspeed.utils import groups

    groups._WORLD_GROUP = dist.new_group(
        ranks=list(range(dist.get_world_size())), timeout=datetime.timedelta(seconds=timeout_s)
    )


def init_distributed(
    backend: str,
    *,
    rank: int,
    world_size: int,
    master_addr: str,
    master_port: int,
    timeout_s: float | None = None,
) -> torch.device:
    """Join (or check) the learner group's torch.distributed world; returns this rank's device (``backend``
    "auto": NCCL and the first GPU when CUDA is there, else gloo on the CPU). ``timeout_s`` bounds each
    collective (NCCL's watchdog aborts a rank past it; None: torch's default, 10 minutes for NCCL), those of
    DeepSpeed's own data-parallel group included (`deepspeed_world_group`)."""
    if backend == "auto":
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    device = torch.device("cuda", 0) if backend == "nccl" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    os.environ.update(
        MASTER_ADDR=master_addr,
        MASTER_PORT=str(master_port),
        RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_RANK="0",
    )
    if not dist.is_initialized():
        forget_deepspeed_groups()
        dist.init_process_group(
            backend,
            init_method=f"tcp://{master_addr}:{master_port}",
            rank=rank,
            world_size=world_size,
            device_id=device if device.type == "cuda" else None,
            timeout=None if timeout_s is None else datetime.timedelta(seconds=timeout_s),
        )
        if timeout_s is not None:
            deepspeed_world_group(timeout_s)
    elif (dist.get_rank(), dist.get_world_size()) != (rank, world_size):
        raise RuntimeError("torch.distributed is already initialised with another rank/world size")
    else:  # a world another library started, after DeepSpeed cached the groups of an earlier one
        forget_deepspeed_groups(only_stale=True)
    return device
