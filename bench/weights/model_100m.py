"""The ~100M-parameter fp32 model of the weight benches, registered on import as `builtin:bench-100m`
(built once into the model cache by `resolve_model`)."""

from __future__ import annotations

from exgrpo.models.resolve import BuiltinModel, register_builtin
from exgrpo.models.tiny import TinyModelSpec, build_tiny_model

SPEC_100M = TinyModelSpec(
    hidden_size=768,
    num_layers=14,
    num_heads=12,
    num_kv_heads=4,
    head_dim=64,
    intermediate_size=2304,
    max_position=256,
)
MODEL = "builtin:bench-100m"  # what model.path names
register_builtin(
    MODEL.removeprefix("builtin:"),
    BuiltinModel(
        build=lambda out_dir, *, cache_dir: build_tiny_model(out_dir, spec=SPEC_100M),
        fingerprint=SPEC_100M.fingerprint(),
    ),
)
