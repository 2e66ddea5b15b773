"""The direct weight load of vLLM-CPU samplers (`actors/vllm_load.py`) against a freshly loaded engine.

A sampler's engine starts from the base weights, receives other weights the way the object-store transport
delivers them (`Packer` -> a read-only buffer -> `unpack_weights`), and must then generate exactly what a
vLLM engine started from those weights generates: the same tokens and the same log-probs, seeded, tied and
untied embeddings, float32 and bfloat16.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from actors.engines import weights_checksum
from actors.factory import make_engine
from actors.vllm_load import _rows
from exgrpo.models.tiny import TinyModelSpec, build_tiny_model
from exgrpo.transport.packed import PackedWeights, Packer, unpack_weights

torch.set_num_threads(1)

PROMPTS = ["Q: 2+3?\nA:", "hello world", "x"]


def test_rows_view_parts_that_lie_back_to_back_and_copy_the_rest() -> None:
    flat = torch.arange(24.0)
    a, b = flat[:8].view(2, 4), flat[8:20].view(3, 4)
    fused = _rows([a, b])
    assert fused.data_ptr() == a.data_ptr() and torch.equal(fused, torch.cat([a, b]))
    apart = _rows([a, flat[12:24].view(3, 4)])  # a gap between the parts: one concatenation
    assert apart.data_ptr() != a.data_ptr() and torch.equal(apart, torch.cat([a, flat[12:24].view(3, 4)]))
    swapped = _rows([b, a])  # adjacent in memory, but in the other order
    assert torch.equal(swapped, torch.cat([b, a]))


def _delivered(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """What a sampler gets from the object store: views of a read-only copy of rank 0's packed buffer."""
    packed = Packer().pack(state)
    buffer = packed.buffer.copy()
    buffer.flags.writeable = False
    return unpack_weights(PackedWeights(layout=packed.layout, buffer=buffer))


def _perturbed(base: Path, out: Path) -> dict[str, torch.Tensor]:
    """The base model plus N(0, 0.05^2) noise, saved as a model directory of its own."""
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.05)
    shutil.copytree(base, out)
    model.save_pretrained(out)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _params(worker) -> dict[str, torch.Tensor]:
    """Runs on the worker: the served model's plain parameters (a kernel's own copy is not one)."""
    model = worker.model_runner.get_model()
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.numel()}


def _served(engine) -> dict[str, torch.Tensor]:
    return engine.llm.collective_rpc(_params)[0]


def _outputs(engine) -> list:
    return engine.generate(PROMPTS, n=3, max_tokens=16, temperature=0.9, seed=5)


@pytest.mark.vllm
@pytest.mark.parametrize(
    ("tied", "dtype"),
    [(True, "float32"), (False, "float32"), (True, "bfloat16")],
    ids=["tied", "untied", "bf16"],
)
def test_direct_load_generates_what_a_freshly_loaded_engine_generates(
    tmp_path: Path, tied: bool, dtype: str
) -> None:
    pytest.importorskip("vllm")
    spec = TinyModelSpec(init_std=0.3, tie_word_embeddings=tied, arch="qwen2" if tied else "llama")
    base = build_tiny_model(tmp_path / "base", spec=spec)
    state = _perturbed(base, tmp_path / "new")
    fresh = make_engine("vllm", tmp_path / "new", dtype=dtype, seed=0)
    want, want_sum, want_params = _outputs(fresh), fresh.checksum(), _served(fresh)
    del fresh
    engine = make_engine("vllm", base, dtype=dtype, seed=0)
    assert engine.weight_path == "direct", engine.weight_path_reason
    before = _outputs(engine)
    assert before != want  # the base weights sample otherwise: the comparison below can fail
    engine.load_weights(_delivered(state), version=3)
    assert engine.version == 3
    got = _served(engine)  # bit for bit, in the dtype and layout the kernels left them (a bias widened to
    assert got.keys() == want_params.keys()  # float32 by the AMX GEMM holds bfloat16-rounded values)
    for name, value in want_params.items():
        assert got[name].dtype == value.dtype and torch.equal(got[name], value), name
    assert _outputs(engine) == want  # tokens, text and log-probs, exactly
    assert engine.checksum() == pytest.approx(want_sum, rel=1e-9)
    if dtype == "float32":
        assert want_sum == pytest.approx(weights_checksum(state, tie_word_embeddings=tied), rel=1e-6)
    engine.load_weights(_delivered(state), version=4)  # a second load onto rebuilt kernels: the same
    assert _outputs(engine) == want


@pytest.mark.vllm
def test_direct_load_refuses_a_state_dict_without_a_fused_part(tmp_path: Path) -> None:
    pytest.importorskip("vllm")
    base = build_tiny_model(tmp_path / "base", spec=TinyModelSpec(init_std=0.3))
    engine = make_engine("vllm", base, seed=0)
    before, checksum = _outputs(engine), engine.checksum()
    state = _perturbed(base, tmp_path / "new")
    del state["model.layers.1.self_attn.k_proj.weight"]
    with pytest.raises(KeyError, match="k_proj.weight"):
        engine.load_weights(_delivered(state), version=1)
    assert engine.version == 0 and engine.checksum() == checksum  # nothing was written
    assert _outputs(engine) == before


def _reload_session(worker, weights: list, load: bool) -> None:
    """What vLLM's weight-transfer API runs on the worker (start, update, finish); `load=False` is a
    session abandoned before any weight arrived (the sampler's `_close_update`)."""
    from vllm.model_executor.model_loader.reload import finalize_layerwise_reload, initialize_layerwise_reload

    model = worker.model_runner.get_model()
    initialize_layerwise_reload(model)
    if load:
        model.load_weights(weights)
    finalize_layerwise_reload(model, worker.model_runner.model_config)


@pytest.mark.vllm
def test_direct_load_after_weight_transfer_sessions_generates_what_a_fresh_engine_generates(
    tmp_path: Path,
) -> None:
    """The collective transport's sessions (one complete, one abandoned), then the object-store fallback's
    direct load: the sessions leave buffering loaders on some parameters, which must not swallow the load."""
    pytest.importorskip("vllm")
    base = build_tiny_model(tmp_path / "base", spec=TinyModelSpec(init_std=0.3))
    first = _perturbed(base, tmp_path / "first")
    state = _perturbed(tmp_path / "first", tmp_path / "new")
    fresh = make_engine("vllm", tmp_path / "new", seed=0)
    want = _outputs(fresh)
    del fresh
    engine = make_engine("vllm", base, seed=0)
    engine.llm.collective_rpc(_reload_session, args=(list(first.items()), True))
    assert engine.checksum() == pytest.approx(weights_checksum(first, tie_word_embeddings=True), rel=1e-6)
    engine.llm.collective_rpc(_reload_session, args=([], False))
    engine.load_weights(_delivered(state), version=2)
    assert engine.checksum() == pytest.approx(weights_checksum(state, tie_word_embeddings=True), rel=1e-6)
    assert _outputs(engine) == want
