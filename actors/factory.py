"""`make_engine`: the engine a config names (`samplers.engine`: `hf` or `vllm`); vLLM is imported only when asked for."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from actors.engines import HFEngine, TokenizingEngine
from exgrpo.core.config import EngineKind


def make_engine(kind: EngineKind, model_path: str | Path, **kwargs: Any) -> TokenizingEngine:
    """Build an engine by kind; keyword arguments go to its constructor."""
    if kind == "hf":
        return HFEngine(model_path, **kwargs)
    if kind == "vllm":
        from actors.vllm_engine import VLLMEngine

        return VLLMEngine(model_path, **kwargs)
    raise ValueError(f"unknown engine kind {kind!r}; use 'hf' or 'vllm'")
