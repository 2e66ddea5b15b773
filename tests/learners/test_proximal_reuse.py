"""The learner's skipped proximal pass (one mini-batch, no TIS) trains exactly like the separate pass.

With one mini-batch the proximal policy (the weights before this update) is the policy of the mini-batch's
own forward, so ``Learner.update`` takes that forward's detached log-probs as ``old_logp`` instead of running
a second, no-grad forward. These tests run both paths on the same batches and compare losses, metrics,
gradient norms and the weights after each step: on CPU they are bitwise equal (the no-grad forward and the
grad forward of the same micro-batch compute the same log-probs, so the separate pass's ratio is exactly 1 too).
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
from learners import update as U  # noqa: E402
from learners.learner import Learner  # noqa: E402

torch.set_num_threads(1)
MAX_LEN = 8
METRICS = (M.LOSS, M.PG_LOSS, M.ENTROPY, M.GRAD_NORM, M.CLIP_FRAC, M.RATIO_FRESH, M.RATIO_REPLAY, M.APPROX_KL)


@pytest.fixture(scope="module")
def model_path(tmp_path_factory) -> str:
    return save_tiny_qwen2(tmp_path_factory, seed=1, name="tiny-qwen2-proximal")


def _learner(path: str, *, reuse: bool, loss: LossConfig, **cfg) -> Learner:
    base = dict(lr=1e-3, micro_batch_size=3, minibatches=1, zero_stage=0)
    learner = Learner(
        model_path=path, learner=LearnerConfig(**{**base, **cfg}), loss=loss, max_response_len=MAX_LEN
    )
    learner.setup()
    learner.reuse_proximal = reuse
    return learner


def _params(learner: Learner) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in learner.engine.module.state_dict().items()}


def _count_proximal_passes(learner: Learner, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the no-grad log-prob passes the update runs over this learner's model (``learners.update``'s
    ``per_token`` with ``what="logp"``); wrappers for several learners chain, each counting its own."""
    calls = [0]
    inner = U.per_token

    def counting(model, rows, r_max, what, **kw):  # noqa: ANN001, ANN003
        calls[0] += model is learner.engine and what == "logp"
        return inner(model, rows, r_max, what, **kw)

    monkeypatch.setattr(U, "per_token", counting)
    return calls


@pytest.mark.parametrize("clip", [True, False])
@pytest.mark.parametrize("norm", ["constant", "token_mean"])
def test_skipped_proximal_pass_trains_identically(model_path, clip, norm, monkeypatch):
    loss = LossConfig(norm=norm, entropy_coef=0.01)
    fast, slow = (_learner(model_path, reuse=r, loss=loss) for r in (True, False))
    fast_calls, slow_calls = (_count_proximal_passes(x, monkeypatch) for x in (fast, slow))
    for step, stale in enumerate((False, True, True)):  # weights move after the first step
        groups = tiny_groups(step, stale=stale)
        got = fast.update(TrainBatch(groups=groups, version=step, clip=clip)).metrics
        want = slow.update(TrainBatch(groups=groups, version=step, clip=clip)).metrics
        for key in METRICS:
            a, b = got[key], want[key]
            assert (math.isnan(a) and math.isnan(b)) or a == b, key
        assert got[M.RATIO_FRESH] == 1.0 and got[M.APPROX_KL] == 0.0 and got[M.CLIP_FRAC] == 0.0
        for name, value in _params(fast).items():
            assert torch.equal(value, _params(slow)[name]), name
    assert fast_calls == [0] and slow_calls == [3]
    assert fast.version() == slow.version() == 3


@pytest.mark.parametrize("case", ["two_minibatches", "tis"])
def test_proximal_pass_still_runs_where_it_is_needed(model_path, case, monkeypatch):
    loss = LossConfig(tis_cap=1.5) if case == "tis" else LossConfig()
    learner = _learner(model_path, reuse=True, loss=loss, minibatches=2 if case == "two_minibatches" else 1)
    calls = _count_proximal_passes(learner, monkeypatch)
    learner.update(TrainBatch(groups=tiny_groups(0, stale=True), version=0, clip=True))
    assert calls == [1]
