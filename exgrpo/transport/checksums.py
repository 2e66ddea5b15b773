"""Per-layer weight sums: what a sampler serves against what the learner sent (``exgrpo.loop.weight_checks``).

One sum per decoder layer (``layer_of``: the ``layers.<i>.`` in a parameter's name, whatever the engine calls the
tensors inside it: vLLM fuses q/k/v and gate/up, HF does not) and one for the rest (embeddings, final norm,
lm_head), in float64. A layer's sum is unchanged by how its tensors are fused or ordered, so the learner's
HF-named state dict and an engine's own parameters give the same numbers. What it cannot see: two same-shape
tensors swapped inside one layer, or any change that keeps a layer's sum (the log-prob gap sees those that change
outputs). Pure: torch only. Tests: tests/exgrpo/loop/test_weight_checks.py.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import torch

REST = "rest"  # the group of every tensor outside the decoder layers
_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def layer_of(name: str) -> str:
    """The group of a parameter name: ``layer <i>`` for ``...layers.<i>....``, else ``rest``."""
    m = _LAYER.search(name)
    return f"layer {int(m.group(1))}" if m else REST


def grouped_sums(
    named: Iterable[tuple[str, torch.Tensor]], *, with_abs: bool = False
) -> tuple[tuple[str, float, float], ...]:
    """(group, float64 sum, float64 sum of |w| or 0.0 without ``with_abs``) per ``layer_of`` group, sorted by
    group; a tensor met twice (a tied lm_head is the embedding) counts once."""
    sums: dict[str, list[float]] = {}
    seen: set[tuple[int, torch.dtype, tuple[int, ...]]] = set()
    with torch.no_grad():
        for name, t in named:
            key = (t.data_ptr(), t.dtype, tuple(t.shape))
            if key in seen:
                continue
            seen.add(key)
            acc = sums.setdefault(layer_of(name), [0.0, 0.0])
            acc[0] += float(t.detach().sum(dtype=torch.float64))
            if with_abs:
                acc[1] += float(t.detach().abs().sum(dtype=torch.float64))
    return tuple((g, s, a) for g, (s, a) in sorted(sums.items()))
