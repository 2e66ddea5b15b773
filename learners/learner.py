"""Learner: one DeepSpeed engine rank of the data-parallel learner group.

A plain class (``ray.remote`` is applied by the caller, so it also runs in-process in tests). One ``update`` is
``learners.update.update`` on this rank's DeepSpeed engine, through ``learners.engine.RankEngine``; the grad-norm
rule is ``learners.optim.GuardedAdamW``'s. Weights leave through ``get_weights`` (the object store) or
``push_weights`` (``exgrpo.transport.vllm_api``), when the transport says (``exgrpo.transport.broadcast``). LoRA and a
KL penalty to the initial policy are optional, both off: docs/lora-kl.md. More: docs/architecture.md ("One step, hop
by hop", hop 9); tests: tests/learners/test_learner.py.
"""

from __future__ import annotations

import contextlib
import io
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from exgrpo.core import metric_names as M
from exgrpo.core.config import LearnerConfig, LossConfig
from exgrpo.core.faults import fault_point
from exgrpo.core.records import Group, ReplayCandidate, TrainBatch, UpdateResult
from exgrpo.core.selection import fill_slots
from exgrpo.transport.checksums import grouped_sums
from exgrpo.transport.packed import PackedWeights, Packer
from exgrpo.transport.ranks import free_port
from learners import batches, logits
from learners import update as U
from learners.diagnostics import gradient_shares
from learners.engine import RankEngine
from learners.modeling import (
    DTYPES,
    ComputePlan,
    checkpointing_on,
    compute_plan,
    init_distributed,
    op_build_env,
    set_checkpointing,
)
from learners.optim import deepspeed_config, make_optimizer
from learners.reference import Reference, checksum, restore_initial
from learners.weights import trained_weights


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
        master_port: int | None = None,
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
        self.weights = trained_weights(learner)  # full fine-tuning or LoRA (``learners/weights.py``)
        self._reference: Reference | None = None  # the KL penalty's reference policy (loss.kl_coef > 0)
        self._initial_path = model_path  # where the initial policy's weights came from (see ``load``)
        self.plan = ComputePlan(False, False, None, dtype)  # how the rank computes (``compute_plan``), set up
        self.compute = dtype  # in words: what the forwards and backwards compute in (``setup`` returns it)

    # ---------------------------------------------------------------- setup
    def rendezvous(self) -> tuple[str, int]:
        """This node's address and a free TCP port on it: rank 0's answer is the group's rendezvous."""
        import ray

        return ray.util.get_node_ip_address(), free_port()

    def setup(self, *, rendezvous: tuple[str, int] | None = None) -> str:
        """Init torch.distributed (at ``rendezvous``, rank 0's address and port, when given; a world of one
        without a port takes a free one), load the HF model, wrap it in a DeepSpeed engine with ``GuardedAdamW``.
        Returns what the forwards and backwards compute in, in words (``learners.autocast``)."""
        if rendezvous is not None:
            self.master_addr, self.master_port = rendezvous
        elif self.master_port is None:
            if self.world_size > 1:
                raise ValueError(f"rank {self.rank} of {self.world_size} needs rank 0's port (master_port)")
            self.master_port = free_port(self.master_addr)
        op_build_env()
        torch.set_num_threads(max(1, int(self.cfg.num_cpus)))
        torch.manual_seed(self.seed)
        self.device = init_distributed(
            self.cfg.backend,
            rank=self.rank,
            world_size=self.world_size,
            master_addr=self.master_addr,
            master_port=self.master_port,
            timeout_s=self.cfg.collective_timeout_s,
        )

        import deepspeed
        from transformers import AutoModelForCausalLM

        deepspeed.utils.logger.setLevel("WARNING")
        model = AutoModelForCausalLM.from_pretrained(self.model_path, dtype=DTYPES[self.dtype])
        model.config.use_cache = False
        model.eval()
        self._num_parameters = sum(p.numel() for p in model.parameters())  # before ZeRO-3 partitions them
        model = self.weights.wrap(model)
        if self.loss_cfg.kl_coef > 0:
            self._reference = Reference(model, lora=self.weights.lora)
        # after the LoRA wrap (which sets eval mode) and the reference's frozen copy (kept in eval mode)
        set_checkpointing(model, checkpointing_on(self.cfg.gradient_checkpointing, self.device))
        self.optimizer = make_optimizer(model, self.cfg)  # the parameters that require grad: the adapters
        # DeepSpeed prints its op-build line on every start ("... built successfully"); quiet runs drop its stdout
        quiet = os.environ.get("EXGRPO_QUIET") == "1"
        with contextlib.redirect_stdout(io.StringIO()) if quiet else contextlib.nullcontext():
            self.engine, *_ = deepspeed.initialize(
                model=model,
                optimizer=self.optimizer,
                config=deepspeed_config(self.cfg, world_size=self.world_size, dtype=self.dtype),
            )
        self.plan = compute_plan(self.cfg, device=self.device, dtype=self.dtype, model=model)
        self.compute = self.plan.sentence
        # this rank's ``UpdateEngine``, built once: its DeepSpeed engine, micro-batches and KL reference
        self.rank_engine = RankEngine(
            self.engine,
            self.optimizer,
            cfg=self.cfg,
            device=self.device,
            world_size=self.world_size,
            reference=self._reference_logprobs if self._reference is not None else None,
            pack=self.plan.pack,
            resize=self.plan.threads.resize if self.plan.threads is not None else None,
        )
        return self.compute

    def _autocasting(self) -> contextlib.AbstractContextManager:
        """CPU bfloat16 autocast when ``learners.autocast`` chose it, else nothing."""
        return torch.autocast("cpu", dtype=torch.bfloat16) if self.plan.autocast else contextlib.nullcontext()

    def version(self) -> int:
        """Policy version of the current weights (the last update's + 1): the tag of weights exported now."""
        return self._version

    # ---------------------------------------------------------------- forward helpers
    @property
    def _chunk_tokens(self) -> int | None:
        """Positions per lm_head chunk (every ZeRO stage: the chunked forward goes through the engine)."""
        return self.cfg.logits_chunk_tokens

    def _per_token(self, rows: Sequence[batches.Row], r_max: int, what: str) -> Tensor:
        """(N, R) no-grad log-probs (``what="logp"``) or entropies of the response tokens."""
        if self.plan.threads is not None:
            self.plan.threads.resize()
        with self._autocasting():
            return logits.per_token(
                self.engine,
                rows,
                r_max,
                what,
                slices=self.rank_engine.micro_batches(rows),
                device=self.device,
                chunk_tokens=self._chunk_tokens,
                pack=self.plan.pack,
            )

    # ---------------------------------------------------------------- public verbs
    def entropies(self, *, candidates: Sequence[ReplayCandidate]) -> list[float]:
        """Mean token entropy (T = 1) of each candidate's response under the current weights (0 if empty)."""
        rows = [
            batches.Row(c.prompt_ids, c.trajectory.response_ids, c.trajectory.logprobs) for c in candidates
        ]
        if not rows and not (self.cfg.zero_stage == 3 and self.world_size > 1):
            return []
        r_max = max([len(r.response_ids) for r in rows] + [1])
        ent = self._per_token(rows, r_max, "entropy")  # (N, R)
        lengths = torch.tensor([len(r.response_ids) for r in rows], dtype=torch.float32)  # (N,)
        return (ent.sum(dim=1) / lengths.clamp(min=1)).tolist()

    def update(self, batch: TrainBatch) -> UpdateResult:
        """One training step on this rank's whole groups (``learners.update.update``); returns the
        ``learner/*`` metrics (with the gradient's split by row origin, ``learners.diagnostics.gradient_shares``,
        every ``learners.grad_share_every`` steps, and the scoring time ``learner/select_time_s``).

        With ``batch.select`` the replay groups' candidates are picked first and the pick fills slot 0 of each
        (done here so the call can be queued behind the previous update): by entropy under the current weights,
        or at random from ``batch.select_seed`` (``exgrpo.core.selection.fill_slots``). The result holds the picks
        and every scored candidate's entropy (group order, then candidate order). ``select=None``: slot 0 is
        already filled."""
        t0 = time.perf_counter()
        groups, entropies, picks = fill_slots(batch, lambda flat: self.entropies(candidates=flat))
        seconds = time.perf_counter() - t0 if batch.select is not None else 0.0
        with self._autocasting():
            gaps: list[tuple[int, int, float, int]] = []
            metrics = self._train(
                groups, clip=batch.clip, version=batch.version, gap_bound=batch.gap_bound, gaps=gaps
            )
        sums = self.weight_sums() if batch.weight_sums else ()
        return UpdateResult(
            metrics={**metrics, M.LEARNER_SELECT_TIME: seconds},
            entropies=tuple(entropies),
            picks=picks,
            weight_sums=sums,
            logprob_gaps=tuple(gaps),
        )

    def weight_sums(self) -> tuple[tuple[str, float, float], ...]:
        """(layer, sum, sum of |w|) per ``checksums.layer_of`` group of the weights samplers are sent (merged under
        LoRA), float64; rank 0's (all gather under ZeRO-3). ``exgrpo.loop.weight_checks`` compares them."""
        with self._full_params(), torch.no_grad():
            if self.rank != 0:
                return ()
            return grouped_sums(self.served().items(), with_abs=True)

    def _train(
        self,
        groups: Sequence[Group],
        *,
        clip: bool,
        version: int,
        gap_bound: float | None = None,
        gaps: list[tuple[int, int, float, int]] | None = None,
    ) -> dict[str, float]:
        shares = {}
        if self.cfg.grad_share_every and version % self.cfg.grad_share_every == 0:
            shares = gradient_shares(
                self.engine.module,
                groups,
                loss=self.loss_cfg,
                max_response_len=self.max_response_len,
                clip=clip,
                device=self.device,
                chunk_tokens=self._chunk_tokens,
            )
        out = U.update(
            self.rank_engine,
            groups,
            loss=self.loss_cfg,
            minibatches=self.cfg.minibatches,
            max_response_len=self.max_response_len,
            clip=clip,
            reuse_proximal=self.reuse_proximal,
            grad_clip=self.cfg.grad_clip,
            version=version,
            gap_bound=gap_bound,
            gaps=gaps,
        )
        fault_point("learner.update")
        self._version = version + 1
        return {**out, **shares}

    def _reference_logprobs(self, enc: batches.Encoded) -> Tensor:
        assert self._reference is not None
        return self._reference.logprobs(self.engine.module, enc, chunk_tokens=self._chunk_tokens)

    # ---------------------------------------------------------------- weights
    def served(self) -> dict[str, Tensor]:
        """The HF-named state dict the samplers serve (merged W + s B A under LoRA); full parameters only inside
        a ZeRO-3 gather."""
        return self.weights.served(self.engine.module)

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
        """float64 sum of all (full) parameters, merged under LoRA (what samplers serve); equal across ranks."""
        with self._full_params():
            return self.weights.served_checksum(self.engine.module)

    def get_weights(self) -> PackedWeights | None:
        """The full HF-named state dict packed in one byte buffer (rank 0; None elsewhere; collective under
        ZeRO-3). Under LoRA the merged weights: every tensor, since the samplers' loads replace whole models."""
        fault_point("learner.broadcast")
        if self.device.type == "cuda":  # the step's queued kernels first (`WeightPusher.wait_for_step`)
            torch.cuda.current_stream(self.device).synchronize()
        with self._full_params():
            return self._packer.pack(self.served()) if self.rank == 0 else None

    def num_parameters(self) -> int:
        return self._num_parameters  # distinct parameters of the full model (a tied embedding counts once)

    def num_trainable(self) -> int:  # the optimiser's parameters: the adapters' under LoRA
        return self.weights.trainable(self.engine.module, total=self._num_parameters)

    def push_weights(
        self, *, version: int, members: Mapping[str, Any] | None, timeout_s: float | None = None
    ) -> dict[str, Any]:
        """Send the current weights to the vLLM samplers ``members`` through vLLM's weight-transfer API.

        Rank 0 drives it (a new world whenever ``members`` changed); under ZeRO-3 the other ranks call it
        too, with ``members=None``, to take part in the per-layer gathers. A failure drops the world, so
        the next push builds a new one."""
        from exgrpo.transport.vllm_api import WeightPusher, backend_for

        source = self.weights.push_source(self.engine.module)  # under LoRA, the merged weights refreshed
        if self._pusher is None:
            self._pusher = WeightPusher(
                module=source,
                backend=backend_for(self.device.type),
                host=self.master_addr,
                zero3=self.cfg.zero_stage == 3,
                is_sender=self.rank == 0,
            )
        if timeout_s is not None:
            self._pusher.timeout_s = timeout_s  # async.weight_timeout_s
        fault_point("learner.broadcast")
        try:
            return self._pusher.push(version=version, members=members)
        except BaseException:
            self._pusher.close()
            raise

    # ---------------------------------------------------------------- checkpoints
    def _initial(self) -> dict[str, Tensor] | None:
        """The frozen tensors of the initial policy, HF-named: LoRA's base or the KL reference's copy (None:
        neither, the initial weights are gone after the first step)."""
        if (frozen := self.weights.frozen_initial(self.engine.module)) is not None:
            return frozen
        if self._reference is not None and self._reference.frozen is not None:
            return dict(self._reference.frozen.named_parameters())
        return None

    def save(self, *, path: str) -> None:
        """HF safetensors in ``path`` (rank 0; under LoRA the merged model, and the adapter alone in
        ``path/adapter`` for PEFT) + DeepSpeed state in ``path/deepspeed`` (all ranks call; under LoRA only
        the adapters and their moments), with where the initial policy's weights came from."""
        out = Path(path)
        with self._full_params():
            if self.rank == 0:
                self.weights.save(self.engine.module, out)
        fault_point("learner.save")
        client: dict[str, Any] = {"version": self._version}
        if (initial := self._initial()) is not None:
            client["initial"] = {"path": self._initial_path, "checksum": checksum(initial)}
        client.update(self.weights.client_state(self.engine.module))
        partial = self.weights.partial_checkpoint  # LoRA: the adapters and their moments only
        self.engine.save_checkpoint(
            str(out / "deepspeed"), tag="state", client_state=client, exclude_frozen_parameters=partial
        )

    def load(self, *, path: str) -> None:
        """Restore weights, optimiser moments and the version saved by ``save`` (all ranks call).

        Under LoRA the adapters load onto the base they were trained on: a resumed run's learner starts
        from the checkpoint's merged weights, so its base (and a KL reference copy) are reloaded from the
        recorded initial model (``learners.reference.restore_initial``)."""
        _, client = self.engine.load_checkpoint(
            str(Path(path) / "deepspeed"),
            tag="state",
            load_lr_scheduler_states=False,
            load_module_strict=not self.weights.partial_checkpoint,  # a LoRA checkpoint holds the adapters only
        )
        if client is None:
            raise FileNotFoundError(f"no DeepSpeed checkpoint under {path}/deepspeed")
        self.weights.check_loaded(self.engine.module, client, path=path)
        if (initial := self._initial()) is not None:
            if "initial" not in client:
                raise ValueError(f"{path} does not record its initial model (written without LoRA or KL)")
            self._initial_path = restore_initial(initial, client["initial"], dtype=DTYPES[self.dtype])
        self._version = int(client["version"])
