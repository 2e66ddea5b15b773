"""The DeepSpeed ``Learner`` with its memory settings on trains like the plain one.

``learners.gradient_checkpointing=on`` (the model in train mode, recomputed in the backward),
``learners.max_tokens_per_micro_batch`` (micro-batches by padded tokens) and a small
``learners.logits_chunk_tokens`` (the lm_head in chunks of 3 positions) change how the update's tensors are
computed, never what it computes: after three updates (two mini-batches each, clipping on, entropy bonus
on), metrics and weights equal the plain learner's (checkpointing off, micro-batches of 3 rows, one chunk).
"""

from __future__ import annotations

import math
import os

os.environ.setdefault("TORCH_EXTENSIONS_DIR", os.path.expanduser("~/.cache/exgrpo/torch_extensions"))

import pytest  # noqa: E402
import torch  # noqa: E402
from tiny_qwen2 import save_tiny_qwen2, tiny_groups  # noqa: E402

from exgrpo.core import metric_names as M  # noqa: E402
from exgrpo.core.config import LearnerConfig, LossConfig  # noqa: E402
from exgrpo.core.records import TrainBatch  # noqa: E402
from learners.learner import Learner  # noqa: E402

torch.set_num_threads(1)
MAX_LEN = 8
LR = 1e-3
METRICS = (M.LOSS, M.PG_LOSS, M.ENTROPY, M.GRAD_NORM, M.CLIP_FRAC, M.RATIO_FRESH, M.RATIO_REPLAY, M.APPROX_KL)


@pytest.fixture(scope="module")
def model_path(tmp_path_factory) -> str:
    return save_tiny_qwen2(tmp_path_factory, seed=2, name="tiny-qwen2-budget")


def _learner(path: str, **cfg) -> Learner:
    base = dict(lr=LR, micro_batch_size=3, minibatches=2, zero_stage=0, backend="gloo")
    learner = Learner(
        model_path=path,
        learner=LearnerConfig(**{**base, **cfg}),
        loss=LossConfig(entropy_coef=0.01),
        max_response_len=MAX_LEN,
    )
    learner.setup()
    return learner


def _forwards(learner: Learner) -> list[int]:
    """Counts the decoder's forwards (recomputes included)."""
    calls = [0]
    learner.engine.module.model.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    return calls


def test_checkpointing_token_budget_and_chunks_train_like_the_plain_learner(model_path):
    plain = _learner(model_path, gradient_checkpointing="off")
    lean = _learner(
        model_path, gradient_checkpointing="on", max_tokens_per_micro_batch=12, logits_chunk_tokens=3
    )
    module = lean.engine.module
    assert module.is_gradient_checkpointing and module.training
    assert not plain.engine.module.is_gradient_checkpointing and not plain.engine.module.training
    plain_calls, lean_calls = _forwards(plain), _forwards(lean)
    for step, stale in enumerate((False, True, True)):
        groups = tiny_groups(step, stale=stale)
        got = lean.update(TrainBatch(groups=groups, version=step, clip=True)).metrics
        want = plain.update(TrainBatch(groups=groups, version=step, clip=True)).metrics
        for key in METRICS:
            a, b = got[key], want[key]
            assert (math.isnan(a) and math.isnan(b)) or a == pytest.approx(b, rel=1e-5, abs=1e-6), key
        ref = plain.engine.module.state_dict()
        off = total = 0
        for name, value in module.state_dict().items():
            if name.endswith("k_proj.bias"):
                # a key bias adds the same score to every key of a query: softmax cancels it, so its gradient
                # is 0 up to rounding, and AdamW turns rounding noise into steps of ~lr (both learners' too)
                continue
            # an element whose gradient is near rounding level gets AdamW's normalised step (up to ~lr) from
            # noise, which CPU kernels round differently: a few such elements may sit apart by a few lr;
            # every other element agrees to 1% of lr
            diff = (value.float() - ref[name].float()).abs()
            assert diff.max().item() <= 2 * LR * (step + 1), name  # each side moved at most ~lr a step
            off, total = off + int((diff > 1e-5).sum()), total + diff.numel()
        assert off <= max(2, total // 10_000), (off, total)
    # the 12-token budget splits the rows more finely than 3 per micro-batch, and each checkpointed
    # forward is run again in its backward: more decoder calls for the same update
    assert lean_calls[0] > plain_calls[0] > 0
