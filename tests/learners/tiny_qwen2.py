"""The random tiny Qwen2 the learner tests train (vocab 64, hidden 64, 2 layers, 2 heads of dim 32), no tokenizer,
the groups they train it on, and an update engine with a test's own micro-batches."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from exgrpo.core.records import Group, Trajectory
from learners.batches import Row
from learners.engine import ModelEngine


def save_tiny_qwen2(tmp_path_factory, *, seed: int, name: str) -> str:
    cfg = Qwen2Config(
        vocab_size=64,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=64,
    )
    torch.manual_seed(seed)
    path = tmp_path_factory.mktemp(name)
    Qwen2ForCausalLM(cfg).save_pretrained(path)
    return str(path)


def tiny_groups(seed: int, *, stale: bool) -> tuple[Group, ...]:
    """4 groups of K=4, lengths 1..7, mixed rewards; group 0 is a replay group whose slot 0 is replayed.
    ``stale``: the fresh rows' sampler log-probs are far from the learner's (what eta >= 1 gives)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(4):
        trajs = []
        for k in range(4):
            n = 1 + (5 * i + 3 * k + seed) % 7
            ids = tuple(torch.randint(1, 64, (n,), generator=g).tolist())
            lp = -2.0 if stale else -4.2
            trajs.append(
                Trajectory(
                    qid=f"q{i}",
                    response_ids=ids,
                    logprobs=tuple(lp + 0.05 * t for t in range(n)),
                    reward=float((i + k) % 3 == 0),
                    policy_version=0,
                    replayed=i == 0 and k == 0,
                )
            )
        out.append(
            Group(
                qid=f"q{i}",
                prompt_ids=tuple(range(1, 2 + i)),
                trajectories=tuple(trajs),
                kind="replay" if i == 0 else "fresh",
            )
        )
    return tuple(out)


class SlicedEngine(ModelEngine):
    """A bare model's `UpdateEngine` with the test's own micro-batches `slices`, each micro-batch's objective
    handed to `backward` (e.g. recorded, then backpropagated), for `learners.update.minibatch_backward`."""

    def __init__(
        self,
        model: torch.nn.Module,
        slices: Sequence[slice],
        backward: Callable[[torch.Tensor], object],
        *,
        chunk_tokens: int | None = None,
    ) -> None:
        super().__init__(model, micro_batch_size=1, chunk_tokens=chunk_tokens)
        self._slices, self._backward = list(slices), backward

    def micro_batches(self, rows: Sequence[Row]) -> list[slice]:
        return list(self._slices)

    def backward(self, objective: torch.Tensor) -> None:
        self._backward(objective)
