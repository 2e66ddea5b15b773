"""bfloat16 learners on CPU against float32: the same three updates (chunked log-probs, 3 micro-batches each)
at ZeRO 1, 2 and 3 stay within bfloat16's tolerance of the float32 run; ZeRO-0 (DeepSpeed's loss-scaled bf16
optimizer with bf16 gradients) is refused by the config for drifting further (exgrpo/core/config.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_learner import MAX_LEN, _groups, model_path  # noqa: F401  (the module-scoped model fixture)

from exgrpo.core import metric_names as M
from exgrpo.core.config import LearnerConfig, LossConfig
from exgrpo.core.records import TrainBatch
from exgrpo.transport.packed import unpack_weights
from learners.learner import Learner

# bf16 keeps 8 bits of mantissa (relative step 2^-8 = 0.4%): a grad norm within 1% and weights within one Adam
# step (lr 1e-3) of the float32 run, after three steps; float32 runs of different stages agree to 1e-5
GRAD_RTOL, WEIGHT_ATOL = 0.01, 1e-2


def _run(path: str, dtype: str, zero_stage: int) -> tuple[list[float], dict[str, np.ndarray]]:
    learner = Learner(
        model_path=path,
        learner=LearnerConfig(lr=1e-3, micro_batch_size=3, zero_stage=zero_stage, logits_chunk_tokens=2),
        loss=LossConfig(norm="token_mean", entropy_coef=0.01),
        max_response_len=MAX_LEN,
        dtype=dtype,
    )
    learner.setup()
    norms = [
        learner.update(TrainBatch(groups=_groups(10 + s), version=s, clip=True)).metrics[M.GRAD_NORM]
        for s in range(3)
    ]
    packed = learner.get_weights()
    assert {s.dtype for s in packed.layout} == {dtype}  # what the samplers are sent
    return norms, {k: v.to(torch.float32).numpy() for k, v in unpack_weights(packed).items()}


@pytest.mark.parametrize("zero_stage", [1, 2, 3])
def test_bfloat16_updates_stay_within_bf16_tolerance_of_float32(model_path, zero_stage):  # noqa: F811
    want_norms, want = _run(model_path, "float32", 0)
    got_norms, got = _run(model_path, "bfloat16", zero_stage)
    np.testing.assert_allclose(got_norms, want_norms, rtol=GRAD_RTOL)
    assert got.keys() == want.keys()
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=0, atol=WEIGHT_ATOL, err_msg=k)
