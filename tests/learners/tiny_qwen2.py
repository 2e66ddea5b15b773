"""The random tiny Qwen2 the learner tests train (vocab 64, hidden 64, 2 layers, 2 heads of dim 32), no tokenizer."""

from __future__ import annotations

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM


def save_tiny_qwen2(tmp_path_factory, *, seed: int, name: str) -> str:
    cfg = Qwen2Config(
        vocab_size=64,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=64,
    )
    torch.manual_seed(seed)
    path = tmp_path_factory.mktemp(name)
    Qwen2ForCausalLM(cfg).save_pretrained(path)
    return str(path)
