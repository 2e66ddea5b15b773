"""Learner: one DeepSpeed engine rank of the data-parallel learner group.

A plain class (``ray.remote`` is applied by the caller, so it also runs in-process in tests).

One ``update`` (DESIGN.md section 4):
    1. rows = the groups' trajectories; A = group_advantages(rewards) per group.
    2. old_logp (no grad, current weights) for every row; fresh rows use it as the proximal policy,
       replayed rows use their stored behaviour log-probs instead.
       Optional tis = min(exp(old_logp - sampler_logp), tis_cap) on fresh tokens (staleness).
       With one mini-batch and no tis this pass is skipped: the mini-batch's own forward runs at the same
       weights, so its detached log-probs are exactly old_logp (fresh ratio 1, at any staleness eta).
    3. The rows are split into ``minibatches`` (whole groups, one optimiser step each) and each
       mini-batch into micro-batches of ``micro_batch_size`` sequences (gradient accumulation).

Gradient accumulation is exact. With W ranks, DeepSpeed averages gradients over ranks, and its own
division by ``gradient_accumulation_steps`` is off (that config value is 1; the accumulation boundary is
set by hand on the last micro-batch). Micro-batch j of a mini-batch of N rows and T response tokens
(summed over all ranks) holds n_j rows and t_j tokens, and its objective is
    w_pg * pg_j - c_H * w_H * H_j,   w_pg = W n_j / N (constant normaliser) or W t_j / T (token mean),
                                     w_H = W t_j / T,
so the accumulated, rank-averaged gradient equals the gradient of exgrpo_loss over the whole
mini-batch of all ranks (the entropy bonus is always a token mean). exgrpo_loss returns
pg_j - c_H H_j; the difference of the two weights is added back as c_H (w_pg - w_H) H_j.

The grad-norm rule is applied by the client optimiser (``learners.optim.GuardedAdamW``).

Weights leave through ``get_weights`` (one packed buffer for the object store) or ``push_weights``
(vLLM's weight-transfer API, ``exgrpo.transport.vllm_api``); when they are called is the transport's
business (``exgrpo.transport.broadcast``).
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from exgrpo.core import metric_names as M
from exgrpo.core.algorithm import exgrpo_loss, group_advantages, masked_mean, token_entropy, token_logprobs
from exgrpo.core.config import LearnerConfig, LossConfig
from exgrpo.core.records import Group, ReplayCandidate
from exgrpo.transport.packed import PackedWeights, Packer
from learners.optim import deepspeed_config, make_optimizer

DEFAULT_TORCH_EXTENSIONS_DIR = "~/.cache/exgrpo/torch_extensions"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class _Row:
    """One training sequence: prompt + response, its advantage and behaviour log-probs."""

    prompt_ids: tuple[int, ...]
    response_ids: tuple[int, ...]
    behaviour: tuple[float, ...]  # sampler log-probs (fresh) or stored ones (replayed)
    replayed: bool = False
    advantage: float = 0.0


@dataclass(frozen=True)
class _Encoded:
    input_ids: Tensor  # (n, S) prompt + response, right-padded with 0
    attention_mask: Tensor  # (n, S)
    positions: Tensor  # (n, R) index of the logit predicting each response token
    tokens: Tensor  # (n, R) response tokens (0 at padding)
    mask: Tensor  # (n, R) bool, true on response tokens


def _encode(rows: Sequence[_Row], r_max: int, device: torch.device) -> _Encoded:
    n, s = len(rows), max(len(r.prompt_ids) + len(r.response_ids) for r in rows)
    ids = torch.zeros(n, s, dtype=torch.long)
    attn = torch.zeros(n, s, dtype=torch.long)
    pos = torch.zeros(n, r_max, dtype=torch.long)
    tok = torch.zeros(n, r_max, dtype=torch.long)
    mask = torch.zeros(n, r_max, dtype=torch.bool)
    for i, r in enumerate(rows):
        p, k = len(r.prompt_ids), len(r.response_ids)
        if p == 0:
            raise ValueError("a sequence needs at least one prompt token to score its first response token")
        ids[i, : p + k] = torch.tensor(r.prompt_ids + r.response_ids)
        attn[i, : p + k] = 1
        pos[i, :k] = torch.arange(p - 1, p + k - 1)
        tok[i, :k] = torch.tensor(r.response_ids)
        mask[i, :k] = True
    return _Encoded(ids.to(device), attn.to(device), pos.to(device), tok.to(device), mask.to(device))


def _pad(values: Sequence[Sequence[float]], r_max: int) -> Tensor:
    out = torch.zeros(len(values), r_max, dtype=torch.float32)  # (N, R)
    for i, v in enumerate(values):
        out[i, : len(v)] = torch.tensor(v, dtype=torch.float32)
    return out


def _chunks(n: int, size: int) -> list[slice]:
    return [slice(i, min(i + size, n)) for i in range(0, n, size)]


def _weighted(pairs: Sequence[tuple[float, float]]) -> float:
    """Weighted mean of (value, weight) pairs, skipping zero weights and NaN values; NaN if none."""
    kept = [(v, w) for v, w in pairs if w > 0 and not math.isnan(v)]
    total = sum(w for _, w in kept)
    return sum(v * w for v, w in kept) / total if total > 0 else math.nan


class Learner:
    """One DeepSpeed rank: ``setup``, then ``entropies`` / ``update`` / weight export and sync."""

    def __init__(
        self,
        *,
        model_path: str,
        learner: LearnerConfig,
        loss: LossConfig,
        max_response_len: int,
        rank: int = 0,
        world_size: int = 1,
        master_addr: str = "127.0.0.1",
        master_port: int = 29500,
        seed: int = 0,
        dtype: str = "float32",
    ) -> None:
        if dtype not in DTYPES:
            raise ValueError(f"dtype={dtype!r}: choose one of {sorted(DTYPES)}")
        self.model_path, self.cfg, self.loss_cfg = model_path, learner, loss
        self.max_response_len, self.rank, self.world_size = max_response_len, rank, world_size
        self.master_addr, self.master_port, self.seed, self.dtype = master_addr, master_port, seed, dtype
        self._version = 0
        # False: always run the separate no-grad proximal pass (tests compare the two paths)
        self.reuse_proximal = True
        self._packer = Packer()
        self._pusher: Any = None  # exgrpo.transport.vllm_api.WeightPusher, built at the first push
        self.engine: Any = None

    # ---------------------------------------------------------------- setup
    def setup(self) -> None:
        """Init torch.distributed, load the HF model, wrap it in a DeepSpeed engine with ``GuardedAdamW``."""
        os.environ.setdefault("TORCH_EXTENSIONS_DIR", os.path.expanduser(DEFAULT_TORCH_EXTENSIONS_DIR))
        torch.set_num_threads(max(1, int(self.cfg.num_cpus)))
        torch.manual_seed(self.seed)
        backend = self.cfg.backend
        if backend == "auto":
            backend = "nccl" if torch.cuda.is_available() else "gloo"
        self.device = torch.device("cuda", 0) if backend == "nccl" else torch.device("cpu")
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        os.environ.update(
            MASTER_ADDR=self.master_addr,
            MASTER_PORT=str(self.master_port),
            RANK=str(self.rank),
            WORLD_SIZE=str(self.world_size),
            LOCAL_RANK="0",
        )
        if not dist.is_initialized():
            dist.init_process_group(
                backend,
                init_method=f"tcp://{self.master_addr}:{self.master_port}",
                rank=self.rank,
                world_size=self.world_size,
                device_id=self.device if self.device.type == "cuda" else None,
            )
        elif (dist.get_rank(), dist.get_world_size()) != (self.rank, self.world_size):
            raise RuntimeError("torch.distributed is already initialised with another rank/world size")

        import deepspeed
        from transformers import AutoModelForCausalLM

        deepspeed.utils.logger.setLevel("WARNING")
        model = AutoModelForCausalLM.from_pretrained(self.model_path, dtype=DTYPES[self.dtype])
        model.config.use_cache = False
        model.eval()  # dropout off: old_logp equals the first micro-batch's logp (ratio 1 at the start)
        self._num_parameters = sum(p.numel() for p in model.parameters())  # before ZeRO-3 partitions them
        self.optimizer = make_optimizer(model, self.cfg)
        self.engine, *_ = deepspeed.initialize(
            model=model,
            optimizer=self.optimizer,
            config=deepspeed_config(self.cfg, world_size=self.world_size, dtype=self.dtype),
        )

    @property
    def version(self) -> int:
        """Policy version of the current weights (the version of the last update + 1)."""
        return self._version

    # ---------------------------------------------------------------- forward helpers
    def _response_logits(self, enc: _Encoded) -> Tensor:
        logits = self.engine(
            input_ids=enc.input_ids, attention_mask=enc.attention_mask, use_cache=False
        ).logits
        index = enc.positions.unsqueeze(-1).expand(-1, -1, logits.shape[-1])  # (n, R, V)
        return logits.gather(1, index)  # (n, R, V)

    def _micro_slices(self, n: int) -> list[slice]:
        """Micro-batches of ``n`` rows; under ZeRO-3 padded with empty slices to the max over ranks
        (its forward all-gathers parameters, so every rank must run the same number of forwards)."""
        slices = _chunks(n, self.cfg.micro_batch_size)
        if self.cfg.zero_stage == 3 and self.world_size > 1:
            count = torch.tensor(len(slices), device=self.device)
            dist.all_reduce(count, op=dist.ReduceOp.MAX)
            slices += [slice(0, 0)] * (int(count) - len(slices))
        return slices

    @torch.no_grad()
    def _per_token(self, rows: Sequence[_Row], r_max: int, what: str) -> Tensor:
        """(N, R) no-grad log-probs (``what="logp"``) or entropies of the response tokens."""
        out = torch.zeros(len(rows), r_max)
        dummy = _Row(prompt_ids=(0,), response_ids=(0,), behaviour=(0.0,))
        for sl in self._micro_slices(len(rows)):
            chunk = rows[sl] or [dummy]  # ZeRO-3 padding forward
            enc = _encode(chunk, r_max, self.device)
            logits = self._response_logits(enc)  # (n, R, V)
            vals = token_logprobs(logits, enc.tokens) if what == "logp" else token_entropy(logits)
            if rows[sl]:
                out[sl] = torch.where(enc.mask, vals, 0.0).float().cpu()
        return out

    # ---------------------------------------------------------------- public verbs
    def entropies(self, *, candidates: Sequence[ReplayCandidate]) -> list[float]:
        """Mean token entropy (T = 1) of each candidate's response under the current weights (0 if empty)."""
        rows = [_Row(c.prompt_ids, c.trajectory.response_ids, c.trajectory.logprobs) for c in candidates]
        if not rows and not (self.cfg.zero_stage == 3 and self.world_size > 1):
            return []
        r_max = max([len(r.response_ids) for r in rows] + [1])
        ent = self._per_token(rows, r_max, "entropy")  # (N, R)
        lengths = torch.tensor([len(r.response_ids) for r in rows], dtype=torch.float32)  # (N,)
        return (ent.sum(dim=1) / lengths.clamp(min=1)).tolist()

    def update(self, *, groups: Sequence[Group], clip: bool, version: int) -> dict[str, float]:
        """One training step on this rank's whole groups; returns ``learner/*`` metrics."""
        start = time.perf_counter()
        m_count = self.cfg.minibatches
        if not groups or len(groups) % m_count:
            raise ValueError(
                f"{len(groups)} groups cannot be split into learners.minibatches={m_count} "
                "mini-batches of whole groups"
            )
        rows, bounds = [], [0]
        for g in groups:
            rewards = torch.tensor([[t.reward for t in g.trajectories]])  # (1, K)
            adv = group_advantages(rewards, std_normalize=self.loss_cfg.std_normalize)[0]  # (K,)
            for t, a in zip(g.trajectories, adv.tolist(), strict=True):
                rows.append(_Row(g.prompt_ids, t.response_ids, t.logprobs, t.replayed, a))
            bounds.append(len(rows))
        r_max = max(max(len(r.response_ids) for r in rows), 1)
        behaviour = _pad([r.behaviour for r in rows], r_max)  # (N, R)
        replayed = torch.tensor([r.replayed for r in rows])  # (N,)
        # The proximal policy is these weights. With one mini-batch (and no TIS weight, which needs it
        # before the forward) the only forward at these weights is the mini-batch's own: its detached
        # log-probs *are* the proximal ones, so the no-grad pass is skipped (``_minibatch`` takes them).
        proximal_in_minibatch = self.reuse_proximal and m_count == 1 and self.loss_cfg.tis_cap is None
        tis = None
        if proximal_in_minibatch:
            old_logp = behaviour  # (N, R) fresh rows' entries are replaced by the mini-batch's detached logp
        else:
            proximal = self._per_token(rows, r_max, "logp")  # (N, R) current weights, no grad
            old_logp = torch.where(replayed.unsqueeze(1), behaviour, proximal)  # (N, R)
            if self.loss_cfg.tis_cap is not None:
                tis = torch.exp(proximal - behaviour).clamp(max=self.loss_cfg.tis_cap)  # (N, R)
        per = len(groups) // m_count
        history = []
        for m in range(m_count):
            sl = slice(bounds[m * per], bounds[(m + 1) * per])
            history.append(
                self._minibatch(
                    rows[sl],
                    old_logp[sl],
                    tis[sl] if tis is not None else None,
                    r_max=r_max,
                    clip=clip,
                    proximal_is_current=proximal_in_minibatch,
                )
            )
        self._version = version + 1
        out = {k: _weighted([(h[k], 1.0) for h in history]) for k in history[0]}
        out[M.SKIPPED_STEPS] = sum(h[M.SKIPPED_STEPS] for h in history)
        out[M.LEARNER_TOKENS] = sum(h[M.LEARNER_TOKENS] for h in history)
        out[M.LEARNER_UPDATE_TIME] = time.perf_counter() - start
        return out

    def _minibatch(
        self,
        rows: list[_Row],
        old_logp: Tensor,
        tis: Tensor | None,
        *,
        r_max: int,
        clip: bool,
        proximal_is_current: bool = False,
    ) -> dict[str, float]:
        """Accumulate the micro-batch gradients of one mini-batch and take one optimiser step.

        ``proximal_is_current``: ``old_logp`` holds only the replayed rows' behaviour log-probs; fresh rows
        take this forward's detached log-probs (the weights have not moved since the update began).
        """
        lc, w = self.loss_cfg, self.world_size
        lengths = [len(r.response_ids) for r in rows]
        totals = torch.tensor([len(rows), sum(lengths)], dtype=torch.float64, device=self.device)
        if w > 1:
            dist.all_reduce(totals)
        n_all, t_all = float(totals[0]), max(float(totals[1]), 1.0)
        norm_len = self.max_response_len if lc.norm == "constant" else None
        slices = self._micro_slices(len(rows))
        parts: list[tuple[dict[str, float], int, int]] = []
        for j, sl in enumerate(slices):
            self.engine.set_gradient_accumulation_boundary(j == len(slices) - 1)
            chunk = rows[sl]
            n_j, t_j = len(chunk), sum(lengths[sl])
            enc = _encode(chunk or [_Row((0,), (0,), (0.0,))], r_max, self.device)
            logits = self._response_logits(enc)  # (n, R, V)
            logp = token_logprobs(logits, enc.tokens)  # (n, R)
            ent = token_entropy(logits)  # (n, R)
            replayed = torch.tensor([r.replayed for r in chunk] or [False], device=self.device)  # (n,)
            old = logp.detach()  # (n, R) the proximal log-probs when they are the current ones
            if n_j and proximal_is_current:
                old = torch.where(replayed.unsqueeze(1), old_logp[sl].to(self.device), old)
            elif n_j:
                old = old_logp[sl].to(self.device)
            loss, m = exgrpo_loss(
                logp=logp,
                old_logp=old,
                advantages=torch.tensor([r.advantage for r in chunk] or [0.0], device=self.device),
                response_mask=enc.mask,
                replayed=replayed,
                clip=clip,
                clip_eps=lc.clip_eps,
                beta=lc.beta,
                norm_len=norm_len,
                entropy=ent,
                entropy_coef=lc.entropy_coef,
                shaping=lc.policy_shaping,
                tis_weight=tis[sl].to(self.device) if tis is not None and n_j else None,
            )
            w_pg = w * (n_j / n_all if norm_len is not None else t_j / t_all)
            w_h = w * t_j / t_all
            objective = w_pg * loss + lc.entropy_coef * (w_pg - w_h) * masked_mean(ent, enc.mask)
            self.engine.backward(objective, scale_wrt_gas=False)
            if n_j:
                parts.append((m, n_j, t_j))
        self.optimizer.begin()
        self.engine.step()
        return self._minibatch_metrics(parts, constant=norm_len is not None)

    def _minibatch_metrics(
        self, parts: list[tuple[dict[str, float], int, int]], *, constant: bool
    ) -> dict[str, float]:
        pg = _weighted([(m["pg_loss"], n if constant else t) for m, n, t in parts])
        ent = _weighted([(m["entropy"], t) for m, _, t in parts])
        fresh = [(m, m["num_fresh_tokens"]) for m, _, _ in parts]
        return {
            M.LOSS: pg - self.loss_cfg.entropy_coef * ent,
            M.PG_LOSS: pg,
            M.ENTROPY: ent,
            M.CLIP_FRAC: _weighted([(m["clip_frac"], f) for m, f in fresh]),
            M.RATIO_FRESH: _weighted([(m["ratio_fresh_mean"], f) for m, f in fresh]),
            M.RATIO_REPLAY: _weighted(
                [(m["ratio_replay_mean"], m["num_replay_tokens"]) for m, _, _ in parts]
            ),
            M.APPROX_KL: _weighted([(m["approx_kl"], f) for m, f in fresh]),
            M.GRAD_NORM: self.optimizer.last_grad_norm,
            M.SKIPPED_STEPS: float(self.optimizer.overflow),
            M.LEARNER_TOKENS: float(sum(t for _, _, t in parts)),
        }

    # ---------------------------------------------------------------- weights
    @contextlib.contextmanager
    def _full_params(self) -> Iterator[None]:
        """Full parameters inside the block (a collective gather on every rank under ZeRO-3)."""
        if self.cfg.zero_stage == 3:
            import deepspeed

            with deepspeed.zero.GatheredParameters(list(self.engine.module.parameters()), modifier_rank=None):
                yield
        else:
            yield

    def checksum(self) -> float:
        """float64 sum of all (full) parameters; equal across ranks after every step."""
        with self._full_params():
            return float(sum(p.detach().double().sum() for p in self.engine.module.parameters()))

    def get_weights(self) -> PackedWeights | None:
        """The full HF-named state dict packed in one byte buffer (rank 0; None elsewhere; collective under ZeRO-3)."""
        with self._full_params():
            return self._packer.pack(self.engine.module.state_dict()) if self.rank == 0 else None

    def num_parameters(self) -> int:
        """Distinct parameters of the full model (a tied embedding counts once)."""
        return self._num_parameters

    def get_version(self) -> int:
        """``version`` as a remote-callable method (the tag of weights exported now)."""
        return self._version

    def push_weights(self, *, version: int, members: Mapping[str, Any] | None) -> dict[str, Any]:
        """Send the current weights to the vLLM samplers ``members`` through vLLM's weight-transfer API.

        Rank 0 drives it (a new world whenever ``members`` changed); under ZeRO-3 the other ranks call it
        too, with ``members=None``, to take part in the per-layer gathers. A failure drops the world, so
        the next push builds a new one."""
        from exgrpo.transport.vllm_api import WeightPusher, backend_for

        if self._pusher is None:
            self._pusher = WeightPusher(
                module=self.engine.module,
                backend=backend_for(self.device.type),
                host=self.master_addr,
                zero3=self.cfg.zero_stage == 3,
                is_sender=self.rank == 0,
            )
        try:
            return self._pusher.push(version=version, members=members)
        except BaseException:
            self._pusher.close()
            raise

    # ---------------------------------------------------------------- checkpoints
    def save(self, *, path: str) -> None:
        """HF safetensors in ``path`` (rank 0) + DeepSpeed state in ``path/deepspeed`` (all ranks call)."""
        out = Path(path)
        with self._full_params():
            if self.rank == 0:
                self.engine.module.save_pretrained(out, state_dict=self.engine.module.state_dict())
        self.engine.save_checkpoint(
            str(out / "deepspeed"), tag="state", client_state={"version": self._version}
        )

    def load(self, *, path: str) -> None:
        """Restore weights, optimiser moments and the version saved by ``save`` (all ranks call)."""
        _, client = self.engine.load_checkpoint(
            str(Path(path) / "deepspeed"), tag="state", load_lr_scheduler_states=False
        )
        if client is None:
            raise FileNotFoundError(f"no DeepSpeed checkpoint under {path}/deepspeed")
        self._version = int(client["version"])
