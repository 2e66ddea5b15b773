"""The memory plan: predicted peak memory per GPU learner rank and per GPU sampler, from the config's shapes.

Pure arithmetic over a model shape (the model directory's ``config.json``, or one of ``KNOWN``) and the config; all
figures are bytes, the CLI is ``exgrpo/plan.py``. A learner's peak is its persistent terms plus the largest of the
phases that never overlap (``PHASES``, ``learner_peak``); the sampler's engine must fit the device with the
collective transport's receive buffers outside ``gpu_memory_utilization``. Every term, its source and what the
plan leaves out: docs/gpu.md ("The plan's arithmetic"); tests: tests/exgrpo/runtime/test_memory_plan.py.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path

from exgrpo.core.config import Config

GIB = 2**30
HEADROOM = 0.9  # a plan fits when its peak is at most this share of the device (fragmentation, buffers)
SAMPLER_OVERHEAD = 2 * GIB  # vLLM's CUDA graphs, sampler and activation buffers per GPU (an estimate)
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
CHUNK_BYTES = (
    20  # per position and vocabulary entry of a logits chunk (measured; docs/gpu.md, "The plan's arithmetic")
)
# DeepSpeed 0.19's ZeRO-3 defaults (deepspeed/runtime/zero/config.py; learners/optim.py sets neither)
ZERO3_MAX_LIVE_PARAMETERS = 10**9  # stage3_max_live_parameters: gathered parameters held at once
ZERO3_PREFETCH_BUCKET = 5 * 10**7  # stage3_prefetch_bucket_size: parameters fetched ahead of use
# vLLM 0.32's packed NCCL weight broadcast (vllm/distributed/weight_transfer/packed_tensor.py), used with its
# defaults by exgrpo/transport/vllm_api.py (NCCLTrainerInitInfo is built without buffer settings)
PACKED_BUFFER_BYTES = 1 << 30  # DEFAULT_PACKED_BUFFER_SIZE_BYTES: a chunk is packed until it passes this
PACKED_NUM_BUFFERS = 2  # DEFAULT_PACKED_NUM_BUFFERS: chunks in flight on each side

PERSISTENT = ("weights", "gradients", "optimizer", "reference")  # learner terms alive all the time
# the learner terms alive only in one phase (one call at a time per learner actor): peak = persistent + max
PHASES: dict[str, tuple[str, ...]] = {
    "forward/backward": ("activations", "logits", "zero3_live", "lm_head"),
    "optimizer step": ("adamw_step",),
    "weight push": ("transfer",),
    "save/export": ("full_gather",),
}


@dataclass(frozen=True)
class Shape:
    """A Qwen2/Llama decoder's sizes (the fields of its config.json)."""

    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    vocab: int
    tied: bool
    qkv_bias: bool = False
    max_positions: int = 0

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * (self.hidden // self.heads)

    @property
    def params(self) -> int:
        h, kv, i = self.hidden, self.kv_dim, self.intermediate
        layer = 2 * h * h + 2 * h * kv + 3 * h * i + 2 * h + ((h + 2 * kv) if self.qkv_bias else 0)
        return self.vocab * h * (1 if self.tied else 2) + self.layers * layer + h

    @property
    def largest_tensor(self) -> int:
        """Elements of the largest single tensor: the embedding / lm_head (V h), or an MLP matrix (i h)."""
        return max(self.vocab, self.intermediate) * self.hidden


# Public config.json values of the GPU recipes' models (keyed by the basename of model.path, lower case).
KNOWN: dict[str, Shape] = {
    "qwen2.5-math-1.5b": Shape(1536, 8960, 28, 12, 2, 151936, True, True, 4096),
    "qwen2.5-math-7b": Shape(3584, 18944, 28, 28, 4, 152064, False, True, 4096),
    "llama-3.1-8b": Shape(4096, 14336, 32, 32, 8, 128256, False, False, 131072),
}


def read_shape(path: str, *, name: str | None = None) -> Shape:
    """The shape of the model at ``path`` (its config.json), else ``KNOWN[name or basename(path)]``."""
    cfg_file = Path(path).expanduser() / "config.json"
    if name is None and cfg_file.is_file():
        c = json.loads(cfg_file.read_text())
        return Shape(
            hidden=int(c["hidden_size"]),
            intermediate=int(c["intermediate_size"]),
            layers=int(c["num_hidden_layers"]),
            heads=int(c["num_attention_heads"]),
            kv_heads=int(c.get("num_key_value_heads") or c["num_attention_heads"]),
            vocab=int(c["vocab_size"]),
            tied=bool(c.get("tie_word_embeddings", False)),
            qkv_bias=c.get("model_type") == "qwen2",
            max_positions=int(c.get("max_position_embeddings") or 0),
        )
    key = (name or Path(path.partition("@")[0]).name).lower()  # a hub id: org/name[@revision]
    if key not in KNOWN:
        raise ValueError(
            f"no config.json at {cfg_file} and no known shape named {key!r}; "
            f"pass --shape with one of {sorted(KNOWN)}"
        )
    return KNOWN[key]


def learner_peak(terms: dict[str, int]) -> int:
    """Bytes at a learner rank's peak: the persistent terms plus the largest phase (``PHASES``)."""
    return sum(terms.get(k, 0) for k in PERSISTENT) + max(phase_bytes(terms).values())


def phase_bytes(terms: dict[str, int]) -> dict[str, int]:
    """Bytes of each phase's own terms (without the persistent ones)."""
    return {name: sum(terms.get(k, 0) for k in keys) for name, keys in PHASES.items()}


def checkpoint_bytes(cfg: Config, shape: Shape) -> dict[str, int]:
    """Bytes one checkpoint writes, by part (docs/gpu.md, "The plan's arithmetic"): the HF weights, DeepSpeed's module copy
    (ZeRO 0-2) and the optimiser state (fp32 master + two AdamW moments)."""
    b, p, z = DTYPE_BYTES[cfg.model.dtype], shape.params, cfg.learners.zero_stage
    trains = cfg.learners.lora_rank == 0
    return {
        "hf_weights": p * b,
        "deepspeed_module": p * b if z < 3 and trains else 0,
        "optimizer": (8 + (4 if b < 4 else 0)) * p if trains else 0,
    }


@dataclass(frozen=True)
class Plan:
    learner: dict[str, int]  # term -> bytes per learner rank (rank 0 for "transfer")
    sampler: dict[str, int]  # term -> bytes per sampler GPU ("receive" lies outside gpu_memory_utilization)
    kv_tokens: int  # tokens the KV cache holds per sampler
    kv_needed: int  # tokens one generation call asks for
    seq_tokens: int  # one sequence (prompt + response): vLLM refuses to start below it
    device_bytes: int
    on_gpu: tuple[bool, bool]  # (learners, samplers)
    knobs: tuple[str, ...]  # what to turn when the learner does not fit
    checkpoint: dict[str, int] = field(default_factory=dict)  # part -> bytes of one checkpoint
    checkpoints_kept: int = 1  # trainer.keep_checkpoints

    @property
    def learner_peak(self) -> int:
        return learner_peak(self.learner)

    @property
    def sampler_peak(self) -> int:
        return sum(self.sampler.values())

    @property
    def fits(self) -> bool:
        learner_ok = not self.on_gpu[0] or self.learner_peak <= HEADROOM * self.device_bytes
        sampler_ok = not self.on_gpu[1] or (
            self.kv_tokens >= self.seq_tokens and self.sampler_peak <= self.device_bytes
        )
        return learner_ok and sampler_ok


def micro_tokens(cfg: Config) -> int:
    lr, m = cfg.learners, cfg.model
    whole = lr.micro_batch_size * (m.max_prompt_len + m.max_response_len)
    return whole if lr.max_tokens_per_micro_batch is None else min(whole, lr.max_tokens_per_micro_batch)


def _packed_chunk(shape: Shape, b: int) -> int:
    """The largest chunk vLLM's packed broadcast makes: past 1 GiB by at most one tensor."""
    return PACKED_BUFFER_BYTES + shape.largest_tensor * b


def learner_terms(
    cfg: Config, shape: Shape, *, on_gpu: bool, tokens: int | None = None, chunked: bool | None = None
) -> dict[str, int]:
    """Bytes per learner rank by term (docs/gpu.md, "The plan's arithmetic"; ``learner_peak`` adds them by phase).
    ``chunked`` None: as the learner computes them, in chunks at every ZeRO stage
    (`learners.learner.Learner._chunk_tokens`)."""
    lr = cfg.learners
    chunked = True if chunked is None else chunked
    b, p, n, z = DTYPE_BYTES[cfg.model.dtype], shape.params, lr.num, lr.zero_stage
    checkpointing = lr.gradient_checkpointing == "on" or (lr.gradient_checkpointing == "auto" and on_gpu)
    trains = lr.lora_rank == 0
    t = micro_tokens(cfg) if tokens is None else tokens
    h, kv, i = shape.hidden, shape.kv_dim, shape.intermediate
    layer_token = b * (6 * h + 2 * kv + 4 * i)
    acts = (shape.layers * b * h + layer_token) * t if checkpointing else shape.layers * layer_token * t
    chunk = min(t, lr.logits_chunk_tokens) if chunked else t
    head = shape.vocab * h * b
    collective = on_gpu and cfg.async_.weight_sync == "collective"
    return {
        "weights": p * b // (n if z == 3 else 1),
        "gradients": (p * b // (n if z >= 2 else 1) + (4 * p // (n if z >= 1 else 1) if b < 4 else 0))
        if trains
        else 0,
        "optimizer": ((8 + (4 if b < 4 else 0)) * p // (n if z >= 1 else 1)) if trains else 0,
        "reference": p * b if cfg.loss.kl_coef > 0 else 0,
        "activations": acts,
        "logits": chunk * shape.vocab * (CHUNK_BYTES if chunked else b + 16),
        "zero3_live": min(p, ZERO3_MAX_LIVE_PARAMETERS + ZERO3_PREFETCH_BUCKET) * b if z == 3 else 0,
        "lm_head": (head if z == 3 else 0) + (head if z >= 2 and trains else 0),
        "adamw_step": 4 * p // (n if z >= 1 else 1) if trains else 0,
        "transfer": (3 if z == 3 else 2) * _packed_chunk(shape, b) if collective else 0,
        "full_gather": p * b - p * b // n if z == 3 else 0,
    }


def plan(cfg: Config, shape: Shape, *, device_gib: float = 80.0) -> Plan:
    lr, s, m = cfg.learners, cfg.samplers, cfg.model
    device = int(device_gib * GIB)
    on_gpu = (lr.num_gpus > 0, s.num_gpus > 0)
    terms = learner_terms(cfg, shape, on_gpu=on_gpu[0])
    b, tp = DTYPE_BYTES[m.dtype], s.tensor_parallel_size
    weights = shape.params * b // tp
    budget = int(s.gpu_memory_utilization * device) - weights - SAMPLER_OVERHEAD
    per_token = 2 * shape.layers * shape.kv_dim * b // tp
    kv_tokens = max(0, budget) // per_token
    seq = m.max_prompt_len + m.max_response_len
    needed = s.requests_per_call * cfg.trainer.rollouts_per_question * seq
    knobs = _knobs(cfg, shape, terms, device, on_gpu[0])
    receive = PACKED_NUM_BUFFERS * _packed_chunk(shape, b) if cfg.async_.weight_sync == "collective" else 0
    return Plan(
        learner=terms,
        sampler={
            "weights": weights,
            "overhead": SAMPLER_OVERHEAD,
            "kv_cache": max(0, budget),
            "receive": receive,
        },
        kv_tokens=kv_tokens,
        kv_needed=needed,
        seq_tokens=seq,
        device_bytes=device,
        on_gpu=on_gpu,
        knobs=knobs,
        checkpoint=checkpoint_bytes(cfg, shape),
        checkpoints_kept=cfg.trainer.keep_checkpoints,
    )


def _knobs(cfg: Config, shape: Shape, terms: dict[str, int], device: int, on_gpu: bool) -> tuple[str, ...]:
    """What would make an unfitting learner fit, most direct first."""
    lr = cfg.learners
    limit = HEADROOM * device
    if not on_gpu or learner_peak(terms) <= limit:
        return ()
    out = []
    persistent = sum(terms[k] for k in PERSISTENT)
    phases = phase_bytes(terms)
    other_phases = max(v for k, v in phases.items() if k != "forward/backward")
    fixed = phases["forward/backward"] - terms["activations"]  # logits shrink too: an upper bound
    per_token = terms["activations"] / max(1, micro_tokens(cfg))
    if lr.gradient_checkpointing == "off":
        out.append("set learners.gradient_checkpointing=on")
    if persistent + max(fixed, other_phases) < limit:
        fit = int((limit - persistent - fixed) / per_token)
        if fit >= cfg.model.max_prompt_len + cfg.model.max_response_len:
            out.append(f"set learners.max_tokens_per_micro_batch={fit} or less")
        elif fit >= 1:
            out.append(
                f"set learners.max_tokens_per_micro_batch={fit} or less (below one whole sequence: "
                "also shorten model.max_response_len)"
            )
    if lr.zero_stage < 3:
        out.append("set learners.zero_stage=3 (partitions the weights too)")
    out.append(f"more learner ranks (learners.num > {lr.num}) to partition the optimiser state")
    out += _lora_knob(cfg, shape, limit)
    return tuple(out)


LORA_RANK = 16  # the rank the LoRA fix names (docs/lora-kl.md)


def _lora_knob(cfg: Config, shape: Shape, limit: float) -> list[str]:
    """LoRA as a fix, when the run trains the full weights and LoRA fits (at ZeRO <= 2, which it needs; with
    gradient checkpointing when it fits only so): it keeps no full gradients nor optimiser state, and trains
    adapters instead of the weights."""
    lr = cfg.learners
    if lr.lora_rank > 0:
        return []
    lora = dataclasses.replace(lr, lora_rank=LORA_RANK, zero_stage=min(lr.zero_stage, 2))
    for checkpointing in (lr.gradient_checkpointing, "on"):  # alone; else with gradient checkpointing
        with_lora = dataclasses.replace(lora, gradient_checkpointing=checkpointing)
        peak = learner_peak(learner_terms(dataclasses.replace(cfg, learners=with_lora), shape, on_gpu=True))
        if peak <= limit:
            sets = " ".join(
                f"learners.{k}={getattr(with_lora, k)}"
                for k in ("lora_rank", "zero_stage", "gradient_checkpointing")
                if getattr(with_lora, k) != getattr(lr, k)
            )
            return [
                f"set {sets} (LoRA: a rank then needs {peak / GIB:.1f} GiB; it trains low-rank adapters, not "
                "the full weights: docs/lora-kl.md)"
            ]
    return []


def _phase_of(term: str) -> str:
    for name, keys in PHASES.items():
        if term in keys:
            return name + (" (rank 0)" if term == "transfer" else "")
    return ""


def render(p: Plan, *, title: str) -> str:
    """The plan as a small table (GiB), with the verdict and the knobs."""

    def g(x: float) -> str:
        return f"{x / GIB:7.2f}"

    lines = [title, f"  learner rank ({'GPU' if p.on_gpu[0] else 'CPU, for information'}):"]
    lines += [f"    {k:<12}{g(v)} GiB  {_phase_of(k)}".rstrip() for k, v in p.learner.items()]
    phases = phase_bytes(p.learner)
    top = max(phases, key=lambda k: phases[k])
    others = ", ".join(f"{k} {v / GIB:.2f}" for k, v in phases.items() if k != top)
    persistent = sum(p.learner[k] for k in PERSISTENT)
    lines.append(
        f"    {'peak':<12}{g(p.learner_peak)} GiB of {p.device_bytes / GIB:.0f} GiB: weights to reference "
        f"{persistent / GIB:.2f} + {top} {phases[top] / GIB:.2f} (the largest phase; {others})"
    )
    if p.on_gpu[1]:
        lines.append("  sampler GPU:")
        lines += [
            f"    {k:<12}{g(v)} GiB" + ("  outside gpu_memory_utilization" if k == "receive" else "")
            for k, v in p.sampler.items()
        ]
        lines.append(f"    {'total':<12}{g(p.sampler_peak)} GiB of {p.device_bytes / GIB:.0f} GiB")
        lines.append(
            f"    KV cache holds {p.kv_tokens} tokens; one call asks for {p.kv_needed} "
            f"({p.kv_tokens / max(1, p.kv_needed):.2f}x; below 1x vLLM queues and preempts)"
        )
    if p.on_gpu[1] and p.kv_tokens < p.seq_tokens:
        lines.append(
            "  fix: the sampler's KV cache holds less than one sequence: raise samplers.gpu_memory_utilization "
            "or samplers.tensor_parallel_size"
        )
    if p.on_gpu[1] and p.sampler_peak > p.device_bytes:
        lines.append(
            "  fix: the sampler's receive buffers do not fit beside gpu_memory_utilization: lower "
            "samplers.gpu_memory_utilization"
        )
    if p.checkpoint:
        one = sum(p.checkpoint.values())
        parts = " + ".join(f"{k} {v / GIB:.1f}" for k, v in p.checkpoint.items() if v)
        lines.append(
            f"  checkpoints: {one / GIB:.1f} GiB ({one / 1e9:.1f} GB) each ({parts} GiB); "
            f"trainer.keep_checkpoints={p.checkpoints_kept} keeps {p.checkpoints_kept * one / GIB:.1f} GiB, "
            f"{(p.checkpoints_kept + 1) * one / GIB:.1f} GiB while the next one is written"
        )
    lines.append(verdict(p))
    lines += [f"  fix: {k}" for k in p.knobs]
    return "\n".join(lines)


def verdict(p: Plan) -> str:
    """The plan's verdict: what a learner rank (and a sampler GPU) needs against what it may use."""
    limit = HEADROOM * p.device_bytes
    allowed = f"{limit / GIB:.1f} GiB ({HEADROOM:.0%} of the {p.device_bytes / GIB:.0f} GiB device)"
    need = f"a learner rank needs {p.learner_peak / GIB:.1f} GiB"
    short = []  # what does not fit
    if p.on_gpu[0] and p.learner_peak > limit:
        short.append(f"{need}; it may use {allowed}")
    if p.on_gpu[1] and p.kv_tokens < p.seq_tokens:
        short.append(
            f"the sampler's KV cache holds {p.kv_tokens} tokens, less than one sequence ({p.seq_tokens})"
        )
    if p.on_gpu[1] and p.sampler_peak > p.device_bytes:
        short.append(f"a sampler GPU needs {p.sampler_peak / GIB:.1f} GiB of {p.device_bytes / GIB:.0f} GiB")
    if short:
        return f"  plan: DOES NOT FIT: {'; '.join(short)}"
    return f"  plan: fits: {need}; it may use {allowed}" if p.on_gpu[0] else "  plan: fits"


def dry_run_report(
    cfg: Config, *, model_path: str | None = None, device_gib: float = 80.0
) -> tuple[str, bool]:
    """What `python -m exgrpo.run --dry-run` prints for a GPU run, and whether it fits (CPU runs: ("", True)).
    A real GPU run checks the same at start (`exgrpo.runtime.assembly.build_system`)."""
    if cfg.learners.num_gpus == 0 and cfg.samplers.num_gpus == 0:
        return "", True
    try:
        shape = read_shape(model_path or cfg.model.path)
    except (ValueError, OSError, KeyError) as err:
        return f"memory plan: not computed ({err})", True
    p = plan(cfg, shape, device_gib=device_gib)
    title = (
        f"memory plan ({device_gib:.0f} GiB per GPU; other sizes: python -m exgrpo.plan --gpu-memory-gib N): "
        f"{shape.params / 1e9:.2f} B parameters, {cfg.model.dtype}"
    )
    return render(p, title=title), p.fits
