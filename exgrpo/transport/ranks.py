"""Ranks of vLLM's weight-transfer world over tensor-parallel samplers (pure arithmetic), and `free_port`, the
port a torch.distributed rendezvous binds (this world's, and the learner group's).

The world is learner rank 0 (the sender) plus every worker of every sampler engine. vLLM gives the worker
of tensor-parallel rank t in an engine initialised with `rank_offset` the world rank `rank_offset + t`
(`vllm.distributed.weight_transfer.nccl_common.worker_init_process_group`; our gloo engine does the same),
so with samplers of sizes tp_0, tp_1, ... (in the order of the world's members):

    world_size = 1 + sum_i tp_i,    rank_offset_i = 1 + sum_{j < i} tp_j.

With one GPU per sampler (tp_i = 1) this is the old 1 + number of samplers and offsets 1 + i.
"""

from __future__ import annotations

import socket
from collections.abc import Sequence


def transfer_ranks(sizes: Sequence[int]) -> tuple[int, list[int]]:
    """(world size, each sampler's rank offset) for samplers with these tensor-parallel sizes, in order."""
    offsets, next_rank = [], 1  # rank 0 is the sender
    for tp in sizes:
        if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
            raise ValueError(f"tensor-parallel sizes must be integers >= 1, got {list(sizes)}")
        offsets.append(next_rank)
        next_rank += tp
    return next_rank, offsets


def free_port(host: str = "") -> int:
    """A TCP port free on ``host`` now ("": every interface)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
