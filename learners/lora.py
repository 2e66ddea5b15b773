"""LoRA for the learner through PEFT: wrap the model, and read back full weights under the base's HF names.

With ``learners.lora_rank`` = r > 0 every targeted ``Linear`` (weight W of shape (d_out, d_in)) gets two
trainable factors, A (r, d_in) and B (d_out, r), and computes x W^T + s x A^T B^T with s = alpha / r. The
base weights are frozen, so the optimiser holds and updates only the r (d_in + d_out) adapter parameters
per layer. B starts at zero, so the wrapped model's outputs start exactly equal to the base's.

The samplers never see an adapter: ``merged_state`` / ``MergedView`` give every tensor under its base HF
name, the targeted weights as W + s B A computed into new tensors (the trained adapter and W are left as
they are), the rest as the base tensors themselves. The samplers' engines and both transports therefore take
LoRA runs as they take full fine-tuning. Both samplers' ``load_weights`` and vLLM's layerwise reload
expect every weight of the model in each update, so every weight is sent, not only the merged ones.

PEFT is imported inside the functions: a run without LoRA does not import it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor

from exgrpo.core.config import LearnerConfig

ADAPTER = "default"  # PEFT's name of the one adapter a learner trains
BASE_LAYER = ".base_layer."  # PEFT puts a targeted layer's original Linear under this attribute


def wrap(model: torch.nn.Module, cfg: LearnerConfig) -> torch.nn.Module:
    """The HF model wrapped by PEFT with adapters on ``cfg.lora_target_modules``; only the adapters train.

    No dropout on the adapters: the learner runs in eval mode (its first forward's log-probs are the
    proximal ones), so adapter dropout would never be active."""
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(
        r=cfg.lora_rank,
        lora_alpha=cfg.lora_alpha,
        target_modules=list(cfg.lora_target_modules),
        lora_dropout=0.0,
        bias="none",
    )
    wrapped = get_peft_model(model, config)
    wrapped.eval()
    return wrapped


def lora_layers(model: torch.nn.Module) -> dict[str, Any]:
    """PEFT's LoRA layers of a wrapped model by their module name inside the HF model."""
    from peft.tuners.lora import LoraLayer

    hf = model.get_base_model()
    return {name: m for name, m in hf.named_modules() if isinstance(m, LoraLayer)}


def merged_weight(layer: Any) -> Tensor:
    """W + s B A of one LoRA layer as a new tensor in W's dtype (computed in float32; nothing is mutated)."""
    w = layer.base_layer.weight  # (d_out, d_in)
    a = layer.lora_A[ADAPTER].weight  # (r, d_in)
    b = layer.lora_B[ADAPTER].weight  # (d_out, r)
    with torch.no_grad():
        return (w.float() + layer.scaling[ADAPTER] * (b.float() @ a.float())).to(w.dtype)


def _base_items(items: Iterator[tuple[str, Tensor]]) -> Iterator[tuple[str, str]]:
    """(PEFT name, base HF name) of the non-adapter entries of ``items``, in their order."""
    for name, _ in items:
        if ".lora_" not in name:
            yield name, name.replace(BASE_LAYER, ".")


def merged_state(model: torch.nn.Module) -> dict[str, Tensor]:
    """The full HF-named state dict of the merged model, in the base model's order (a tied head appears
    under both names, sharing the embedding's storage, as in the base's own state dict)."""
    hf = model.get_base_model()
    layers = lora_layers(model)
    state = hf.state_dict()
    out = {}
    for peft_name, hf_name in _base_items(iter(state.items())):
        owner = hf_name.removesuffix(".weight")
        if peft_name.endswith(BASE_LAYER + "weight") and owner in layers:
            out[hf_name] = merged_weight(layers[owner])
        else:
            out[hf_name] = state[peft_name]
    return out


def base_parameters(model: torch.nn.Module) -> dict[str, Tensor]:
    """The frozen base parameters of a wrapped model under their HF names (a tied weight once)."""
    params = dict(model.get_base_model().named_parameters())
    return {hf_name: params[peft_name] for peft_name, hf_name in _base_items(iter(params.items()))}


def merged_parameters(model: torch.nn.Module) -> dict[str, Tensor]:
    """``base_parameters`` with every targeted weight replaced by its merged W + s B A (a new tensor)."""
    layers = lora_layers(model)
    return {
        name: merged_weight(layers[name.removesuffix(".weight")])
        if name.endswith(".weight") and name.removesuffix(".weight") in layers
        else p
        for name, p in base_parameters(model).items()
    }


def trainable_count(model: torch.nn.Module) -> int:
    """Parameters the optimiser updates (the adapters under LoRA)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


class MergedView:
    """Merged weights under base HF names as persistent tensors, for vLLM's weight-transfer source.

    ``exgrpo.transport.vllm_api.LearnerSource`` reads ``named_parameters()`` once and sends those tensors at
    every push, so the merged weights live in buffers of their own (one copy of the targeted weights, the
    collective transport's memory cost of LoRA) that ``refresh`` rewrites before each push; untargeted
    tensors are the base's own (a tied head once, as ``named_parameters`` gives it)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.layers = lora_layers(model)
        self._tensors = merged_parameters(model)

    def refresh(self) -> None:
        """Recompute W + s B A of every targeted layer into its buffer (the adapters' current values)."""
        with torch.no_grad():
            for owner, layer in self.layers.items():
                self._tensors[f"{owner}.weight"].copy_(merged_weight(layer))

    def named_parameters(self) -> Iterator[tuple[str, Tensor]]:
        yield from self._tensors.items()
