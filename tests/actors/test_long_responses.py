"""Samplers for long responses: the context check and position override, and seeds that never overlap.

A tiny model whose config says max_position_embeddings=32: a 16 + 32 token context is refused without the
override; with model.max_position_embeddings=64 / model.rope_theta the learner's transformers load and the
vLLM (CPU) engine read the same edited config, and vLLM generates past the old limit.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from actors.engines import HFEngine
from actors.sampler import EngineSpec, check_positions, request_seed
from exgrpo.core.config import ConfigError, ModelConfig
from exgrpo.core.positions import check_context, context_len, positioned_model
from exgrpo.models.tiny import TinyModelSpec, build_tiny_model

SHORT = 32  # the tiny model's own position limit


@pytest.fixture(scope="module")
def short_model(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("short") / "model"
    build_tiny_model(out, spec=TinyModelSpec(max_position=SHORT))
    return out


def test_a_context_past_the_position_limit_is_refused_naming_the_override(short_model):
    model = ModelConfig(path=str(short_model), max_prompt_len=16, max_response_len=32)
    with pytest.raises(ConfigError, match=r"model.max_position_embeddings.*model.rope_theta"):
        check_context(model, short_model)
    with pytest.raises(ValueError, match="exceeds max_position_embeddings=32"):
        check_positions(
            EngineSpec(kind="vllm", model_path=str(short_model), max_model_len=context_len(model))
        )
    check_context(ModelConfig(max_prompt_len=16, max_response_len=16), short_model)  # 32 fits
    check_context(
        ModelConfig(max_prompt_len=16, max_response_len=32, max_position_embeddings=64), short_model
    )
    with pytest.raises(ConfigError, match="model.max_position_embeddings=40"):  # an override too small
        check_context(
            ModelConfig(max_prompt_len=16, max_response_len=32, max_position_embeddings=40), short_model
        )


def test_the_override_is_one_config_for_learner_and_samplers(short_model, tmp_path):
    from transformers import AutoConfig, AutoModelForCausalLM

    model = ModelConfig(
        max_prompt_len=16, max_response_len=32, max_position_embeddings=64, rope_theta=40000.0
    )
    assert positioned_model(ModelConfig(), short_model, out_root=tmp_path) == str(short_model)  # no override
    path = positioned_model(model, short_model, out_root=tmp_path)
    assert path != str(short_model) and positioned_model(model, short_model, out_root=tmp_path) == path
    assert positioned_model(model, path, out_root=tmp_path) == path  # already applied (a resumed run)
    assert (
        json.loads((short_model / "config.json").read_text())["max_position_embeddings"] == SHORT
    )  # untouched
    check_positions(EngineSpec(kind="vllm", model_path=path, max_model_len=context_len(model)))
    cfg = AutoConfig.from_pretrained(path)
    assert cfg.max_position_embeddings == 64 and cfg.rope_parameters["rope_theta"] == 40000.0
    learner = AutoModelForCausalLM.from_pretrained(path)  # what learners/learner.py setup loads
    assert learner.config.max_position_embeddings == 64
    assert learner.config.rope_parameters["rope_theta"] == 40000.0
    base = AutoModelForCausalLM.from_pretrained(str(short_model))
    assert sum(p.sum() for p in base.parameters()) == sum(
        p.sum() for p in learner.parameters()
    )  # same weights


def test_vllm_cpu_generates_past_the_old_limit_with_the_override(short_model, tmp_path):
    pytest.importorskip("vllm")
    from actors.vllm_engine import VLLMEngine

    model = ModelConfig(
        max_prompt_len=16, max_response_len=32, max_position_embeddings=64, rope_theta=40000.0
    )
    path = positioned_model(model, short_model, out_root=tmp_path)
    engine = VLLMEngine(path, max_model_len=context_len(model), seed=0)
    assert engine.llm.llm_engine.model_config.max_model_len == 48
    hf_config = engine.llm.llm_engine.model_config.hf_config
    assert hf_config.max_position_embeddings == 64 and hf_config.rope_parameters["rope_theta"] == 40000.0
    prompt = "1+2=" * 3  # 12 tokens (one per character)
    outs = engine.generate([prompt], n=8, max_tokens=32, temperature=1.0, seed=[request_seed(0, 5, 8)])
    longest = max(len(engine.tokenize(prompt)) + len(c.token_ids) for c in outs[0])
    assert longest > SHORT  # past the model's own limit
    again = engine.generate([prompt], n=8, max_tokens=32, temperature=1.0, seed=[request_seed(0, 5, 8)])
    assert [c.token_ids for c in again[0]] == [c.token_ids for c in outs[0]]  # same request seed, same draws


def test_request_seeds_never_overlap_across_calls_and_batching():
    K = 8
    seen: dict[int, tuple[int, int]] = {}
    request_id = 0
    for call in range(200):  # calls of 1..32 requests, n = K or K - 1 (replay requests)
        for _ in range(1 + call % 32):
            n = K - (request_id % 3 == 0)
            base = request_seed(3, request_id, K, n=n)
            for j in range(n):  # vLLM's child j gets base + j
                assert base + j not in seen, (request_id, j, seen.get(base + j))
                seen[base + j] = (request_id, j)
            request_id += 1
    assert len(seen) > 3000
    assert request_seed(3, 7, K) == request_seed(3, 7, K)  # a function of (run seed, request id) only
    assert request_seed(4, 0, K) > request_seed(3, 2**40 // K - 1, K) + K - 1  # run seeds do not collide
    with pytest.raises(ValueError, match="more than the seed stride"):
        request_seed(0, 1, K, n=K + 1)


def test_hf_engine_is_reproducible_under_request_seeds(short_model):
    engine = HFEngine(short_model, seed=0)
    prompts = ["1+2=", "3+4=", "5+6="]
    seeds = [request_seed(0, r, 4) for r in (10, 11, 12)]
    a = engine.generate(prompts, n=4, max_tokens=8, seed=seeds)
    b = engine.generate(prompts, n=4, max_tokens=8, seed=seeds)
    c = engine.generate(prompts, n=4, max_tokens=8, seed=[request_seed(0, r, 4) for r in (20, 21, 22)])
    ids = [[x.token_ids for x in comps] for comps in a]
    assert ids == [[x.token_ids for x in comps] for comps in b]
    assert ids != [[x.token_ids for x in comps] for comps in c]
    with pytest.raises(ValueError, match="one per prompt"):
        engine.generate(prompts, n=1, max_tokens=2, seed=seeds[:2])
