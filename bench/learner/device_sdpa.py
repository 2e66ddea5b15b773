"""The device check's SDPA part: a padded micro-batch with a mask against per-row causal calls on one
Qwen2.5-Math-7B attention layer, forward and backward, and which backend ran (``check_sdpa``). The two ways and
the figures: docs/benchmarks.md, "GPU device check".
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F

from bench.learner.device_shapes import (
    Sizes,
    allocated,
    peak,
    prompt_lengths,
    reset_peak,
    response_lengths,
    setup_device,
    timed,
)


def backend_name(index: int, device: torch.device) -> str:
    from torch.nn.attention import SDPBackend

    name = SDPBackend(index).name.lower()
    if device.type == "cpu":
        return {"flash_attention": "cpu flash", "math": "math"}.get(name, name)
    return name


def _inputs(
    sizes: Sizes, lengths: list[int], dev: torch.device, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator(device=dev).manual_seed(0)
    b, s, d = len(lengths), max(lengths), sizes.hidden // sizes.heads
    q = torch.randn(b, sizes.heads, s, d, generator=g, device=dev, dtype=dtype)
    k = torch.randn(b, sizes.kv_heads, s, d, generator=g, device=dev, dtype=dtype)
    v = torch.randn(b, sizes.kv_heads, s, d, generator=g, device=dev, dtype=dtype)
    valid = torch.arange(s, device=dev)[None, :] < torch.tensor(lengths, device=dev)[:, None]  # (B, S)
    return q, k, v, valid


def _padded_args(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, valid: torch.Tensor) -> dict[str, Any]:
    s, rep = q.shape[2], q.shape[1] // k.shape[1]
    causal = torch.ones(s, s, dtype=torch.bool, device=q.device).tril()
    mask = causal[None, None] & valid[:, None, None, :]  # (B, 1, S, S): causal and a real key
    return dict(
        query=q,
        key=k.repeat_interleave(rep, dim=1),
        value=v.repeat_interleave(rep, dim=1),
        attn_mask=mask,
        is_causal=False,
    )


def _row_args(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, n: int, i: int) -> dict[str, Any]:
    return dict(
        query=q[i : i + 1, :, :n],
        key=k[i : i + 1, :, :n],
        value=v[i : i + 1, :, :n],
        is_causal=True,
        enable_gqa=True,
    )


def _choice(args: dict[str, Any], dev: torch.device) -> str:
    a = args
    index = torch._fused_sdp_choice(
        a["query"],
        a["key"],
        a["value"],
        a.get("attn_mask"),
        0.0,
        a["is_causal"],
        enable_gqa=a.get("enable_gqa", False),
    )
    return backend_name(int(index), dev)


def _accepts(args: dict[str, Any], dev: torch.device) -> dict[str, bool]:
    """Which single backends run this call (a forward under ``sdpa_kernel`` with that backend alone)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    names = (
        ["FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION"]
        if dev.type == "cuda"
        else ["FLASH_ATTENTION", "MATH"]
    )
    out = {}
    for name in names:
        try:
            with sdpa_kernel([getattr(SDPBackend, name)]), torch.no_grad():
                F.scaled_dot_product_attention(**args)
            out[backend_name(int(getattr(SDPBackend, name)), dev)] = True
        except Exception:  # noqa: BLE001 - a refusal of any kind means: not this backend
            out[backend_name(int(getattr(SDPBackend, name)), dev)] = False
    return out


Call = Callable[[], dict[str, Any]]  # the call's arguments, built anew per pass (their views join its graph)


def _fwd_bwd(calls: list[Call], weights: list[torch.Tensor]) -> None:
    for w in weights:
        w.grad = None
    total = sum(F.scaled_dot_product_attention(**c()).float().sum() for c in calls)
    assert isinstance(total, torch.Tensor)
    total.backward()


def _measure(calls: list[Call], weights: list[torch.Tensor], dev: torch.device, reps: int) -> dict[str, Any]:
    _fwd_bwd(calls, weights)  # warm-up
    base = allocated(dev)
    reset_peak(dev)
    seconds = [timed(lambda: _fwd_bwd(calls, weights), dev) for _ in range(reps)]
    return {"seconds": seconds, "extra_peak_bytes": peak(dev) - base if dev.type == "cuda" else None}


def check_sdpa(*, sizes: Sizes, device: str, rows: int, reps: int, seed: int = 3) -> dict[str, Any]:
    dev = setup_device(device)
    dtype = torch.bfloat16
    lengths = [
        p + r
        for p, r in zip(
            prompt_lengths(sizes, rows, seed=seed), response_lengths(sizes, rows, seed=seed), strict=True
        )
    ]
    q, k, v, valid = _inputs(sizes, lengths, dev, dtype)
    weights = [t.requires_grad_() for t in (q, k, v)]
    padded: list[Call] = [lambda: _padded_args(q, k, v, valid)]
    per_row: list[Call] = [partial(_row_args, q, k, v, n, i) for i, n in enumerate(lengths)]
    flags = {}
    if dev.type == "cuda":
        flags = {
            "flash": torch.backends.cuda.flash_sdp_enabled(),
            "efficient": torch.backends.cuda.mem_efficient_sdp_enabled(),
            "cudnn": torch.backends.cuda.cudnn_sdp_enabled(),
            "math": torch.backends.cuda.math_sdp_enabled(),
        }
    out: dict[str, Any] = {
        "lengths": lengths,
        "padded_len": max(lengths),
        "heads": sizes.heads,
        "kv_heads": sizes.kv_heads,
        "head_dim": sizes.hidden // sizes.heads,
        "dtype": str(dtype).removeprefix("torch."),
        "global_switches": flags,
    }
    for name, calls in (("padded", padded), ("per_row", per_row)):
        res = _measure(calls, weights, dev, reps)
        res["backend"] = _choice(calls[0](), dev)  # with grad enabled, as the timed calls ran
        res["backends_per_call"] = sorted({_choice(c(), dev) for c in calls})
        res["accepts"] = _accepts(calls[0](), dev)
        res["non_pad_tokens_per_s"] = sum(lengths) / min(res["seconds"])
        out[name] = res
        print(
            f"[sdpa] {name:>7}: backend {res['backend']} (accepted: "
            f"{', '.join(k for k, ok in res['accepts'].items() if ok)}), {min(res['seconds']) * 1e3:.1f} ms "
            f"forward+backward, {res['non_pad_tokens_per_s']:.0f} non-pad tokens/s",
            flush=True,
        )
    out["per_row_speedup"] = min(out["padded"]["seconds"]) / min(out["per_row"]["seconds"])
    print(
        f"[sdpa] lengths {lengths}; per-row calls are {out['per_row_speedup']:.2f}x the padded call's speed",
        flush=True,
    )
    return out
