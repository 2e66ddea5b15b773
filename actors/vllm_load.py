"""Direct weight load into a vLLM-CPU model runner: new weights straight into the served kernels.

On CPU vLLM keeps a linear layer's weight only inside its GEMM kernel, so `direct_load` (run on the vLLM worker)
rebuilds each linear layer's kernel from the new weight by the layer's own post-processing (a fused layer from a
zero-copy view when its parts lie back to back) and copies every other parameter with the model's own
`load_weights`, instead of vLLM's layerwise reload. `direct_load_support` says whether a model qualifies, and
`actors.vllm_engine.VLLMEngine` says which path it took (`weight_path`). The other path, vLLM's in-place reload,
runs through `reload_in_place`, which undoes a reload that raised part-way (`undo_failed_reload`); after a failed
weight-transfer update `end_failed_update` finishes vLLM's session. More: docs/architecture.md ("Weights");
tests: tests/actors/test_vllm_load.py, tests/actors/test_reload_failure.py.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import Any

import torch

_LINEAR = "UnquantizedLinearMethod"
_EMBEDDING = "UnquantizedEmbeddingMethod"


def direct_load_support(worker: Any) -> str | None:
    """Runs on the worker: None when `direct_load` applies to its model, else the reason it does not."""
    from vllm.distributed import get_tensor_model_parallel_world_size
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return "not a CPU platform (the direct load runs on vLLM-CPU only)"
    if current_platform.is_zen_cpu():
        return "the zentorch GEMM kernel (it may keep its input weight, not a copy)"
    if get_tensor_model_parallel_world_size() != 1:
        return "tensor parallelism (the direct load takes whole weights)"
    model = worker.model_runner.get_model()
    for name, module in model.named_modules():
        method = getattr(module, "quant_method", None)
        if method is None or module.__class__.__name__ in ("Attention", "MLAAttention"):
            continue  # attention holds no loaded weight
        if type(method).__name__ not in (_LINEAR, _EMBEDDING):
            return f"{name} is served by {type(method).__name__} (only unquantized layers load directly)"
    return None


def direct_load(worker: Any, weights: Sequence[tuple[str, torch.Tensor]]) -> None:
    """Runs on the worker: load a full HF-named state dict into the served model (see the module doc).

    Every fused weight is assembled before anything is written, so a missing or misshapen tensor fails
    with nothing changed; a plain parameter the state dict does not cover fails after the load."""
    model = worker.model_runner.get_model()
    named = dict(weights)
    mapping: dict[str, list[str]] = dict(getattr(model, "packed_modules_mapping", {}) or {})
    kernels = []  # (module, its (N, K) weight) for the linear layers whose weight lives in the kernel
    used: set[str] = set()
    for name, module in model.named_modules():
        method = getattr(module, "quant_method", None)
        if type(method).__name__ != _LINEAR or module.weight.numel() != 0:
            continue
        prefix, _, leaf = name.rpartition(".")
        parts = [f"{prefix}.{p}.weight" if prefix else f"{p}.weight" for p in mapping.get(leaf, [leaf])]
        missing = [p for p in parts if p not in named]
        if missing:
            raise KeyError(f"direct weight load: {name} needs {missing}, which the state dict lacks")
        want = (int(module.output_size_per_partition), int(module.input_size_per_partition))
        fused = _rows([named[p] for p in parts])
        if tuple(fused.shape) != want:
            raise ValueError(f"direct weight load: {name} takes {want}, its parts give {tuple(fused.shape)}")
        kernels.append((module, fused.to(module.params_dtype)))
        used.update(parts)
    for module, weight in kernels:
        _rebuild_kernel(module, weight)
    _unwrap_loaders(model)
    dtype = worker.model_runner.model_config.dtype
    loaded = model.load_weights([(n, _as_checkpoint(t, dtype)) for n, t in weights if n not in used])
    kept = {n for n, p in model.named_parameters() if p.numel() > 0}
    if kept - set(loaded):
        raise KeyError(f"direct weight load: the state dict left {sorted(kept - set(loaded))} unloaded")
    for module in model.modules():
        if type(getattr(module, "quant_method", None)).__name__ == _EMBEDDING:
            module.quant_method.process_weights_after_loading(module)  # the logits GEMM of the new table


def _as_checkpoint(tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A float tensor rounded to the served dtype, as a checkpoint load rounds it.

    A fresh engine copies each checkpoint tensor into a parameter of the served dtype before any
    post-processing; some kernels then widen a parameter again (the AMX GEMM keeps a bfloat16 layer's bias in
    float32). Loaded straight into such a widened parameter, a float32 tensor would keep bits that a freshly
    started engine never has."""
    if tensor.is_floating_point() and tensor.element_size() > dtype.itemsize:
        return tensor.to(dtype)
    return tensor


def _unwrap_loaders(model: torch.nn.Module) -> None:
    """Give every parameter back its own weight loader.

    vLLM's layerwise reload (what its weight-transfer API runs) wraps the loaders of parameters a layer
    registers late (qkv_proj's bias) in a loader that only buffers the tensor for the layer's deferred
    processing, and can leave that wrapper on the live parameter; through it, a later load would be
    recorded and never copied. A reload session wraps them again when it starts."""
    for param in model.parameters():
        loader = getattr(param, "weight_loader", None)
        while loader is not None and loader.__name__ == "online_process_loader":
            loader = loader.__wrapped__
        if loader is not None:
            param.weight_loader = loader


def _rows(parts: list[torch.Tensor]) -> torch.Tensor:
    """The parts stacked along dim 0: a view when they lie back to back in one storage, else a copy."""
    first = parts[0]
    if len(parts) == 1:
        return first
    k = first.shape[1]
    adjacent = all(
        p.dim() == 2
        and p.shape[1] == k
        and p.dtype == first.dtype
        and p.is_contiguous()
        and p.untyped_storage().data_ptr() == first.untyped_storage().data_ptr()
        for p in parts
    ) and all(
        b.data_ptr() == a.data_ptr() + a.numel() * a.element_size()
        for a, b in zip(parts, parts[1:], strict=False)
    )
    if not (adjacent and first.is_contiguous()):
        return torch.cat(parts, dim=0)
    rows = sum(int(p.shape[0]) for p in parts)
    return first.new_empty(0).set_(first.untyped_storage(), first.storage_offset(), (rows, k), (k, 1))


def _rebuild_kernel(module: torch.nn.Module, weight: torch.Tensor) -> None:
    """Give a CPU linear layer a new GEMM kernel built from `weight` by the layer's own post-processing."""
    module.weight = torch.nn.Parameter(weight, requires_grad=False)
    module.quant_method.process_weights_after_loading(module)
    if (
        module.weight.numel() != 0
    ):  # a kernel that reads the parameter itself: own it (not the sender's buffer)
        module.weight = torch.nn.Parameter(module.weight.detach().clone(), requires_grad=False)


def load_staged(worker: Any, path: str, layout: list, direct: bool) -> None:
    """Runs on the worker of an engine core in its own process: load the weights a sampler staged in a file
    (`exgrpo.transport.staged`) by the direct load or vLLM's in-place reload, from views of the file."""
    from exgrpo.transport.staged import map_staged

    items = map_staged(path, layout)
    if direct:
        direct_load(worker, items)
    else:
        reload_in_place(worker, items)


def reload_in_place(worker: Any, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
    """Runs on the worker: vLLM's in-place reload (`reload_weights`). One that raises part-way is undone
    (`undo_failed_reload`) before its error goes on, so the next reload starts from whole layers."""
    try:
        worker.reload_weights(weights_iterator=weights)
    except Exception as err:
        undone = undo_failed_reload(worker)
        raise RuntimeError(
            f"vLLM's in-place weight reload failed part-way ({type(err).__name__}: {err}); {undone} layers "
            "left open got their served tensors back, the finished ones keep the new weights"
        ) from err


def undo_failed_reload(worker: Any) -> int:
    """Runs on the worker after vLLM's `reload_weights` raised; returns how many layers were left open.

    vLLM 0.32 leaves such a reload open: each layer not yet finished stays on the meta device, with the
    tensors it received buffered (the one that raised among them) and its parameters' loaders wrapped. The
    next reload skips its set-up, counts the stale tensors toward its total and processes it with them: the
    tensor that raised raises again, or the layer is processed before its new tensors have all arrived
    (tests/actors/test_reload_failure.py: the next load fails, the one after lands with wrong weights). Here
    every open layer forgets what it buffered and is closed by vLLM's own finalize, which puts a layer's
    served tensors back when it loaded nothing. The engine then serves a mix (finished layers new, the rest
    old) until the next full load, which lands whole."""
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.model_loader.reload import finalize_layerwise_reload
    from vllm.model_executor.model_loader.reload.layerwise import get_layerwise_info

    model = worker.model_runner.get_model()
    infos = [get_layerwise_info(layer) for layer in model.modules()]
    reopened = [info for info in infos if info.can_load()]
    for info in reopened:
        info.loaded_weights.clear()
        info.load_numel = 0
    quiet = logging.getLogger(finalize_layerwise_reload.__module__)  # its "Failed to load" line per layer
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        with set_current_vllm_config(worker.vllm_config):
            finalize_layerwise_reload(model, worker.model_runner.model_config)
    finally:
        quiet.setLevel(level)
    _unwrap_loaders(model)
    return len(reopened)


def end_failed_update(worker: Any) -> bool:
    """Runs on the worker after vLLM's `update_weights` raised. vLLM 0.32 then drops the worker's session flag
    without finishing its layerwise reload, and refuses `finish_weight_update`; the layers still waiting for
    weights are left on the meta device. Finish the reload here as `finish_weight_update` would: a layer that
    got no weight gets its served tensors back, one that got some is processed with what it got. Returns
    whether a reload was open."""
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.model_loader.reload.layerwise import get_layerwise_info

    engine = getattr(worker, "weight_transfer_engine", None)
    if engine is None or getattr(worker, "_weight_update_active", False):
        return False  # no weight-transfer engine, or a session vLLM itself still finishes
    model = worker.model_runner.get_model()
    if not any(get_layerwise_info(layer).can_load() for layer in model.modules()):
        return False
    with set_current_vllm_config(worker.vllm_config):
        engine.finish_weight_update()
        engine.reset_weight_update_target()
    return True
