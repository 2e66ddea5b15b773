"""``learners.update.logprob_gap``: the gap between the sampler's and the learner's log-probs of the fresh tokens
sampled at the learner's version, from the update's own log-probs (no extra forward), summed over ranks."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
import torch
from tiny_qwen2 import save_tiny_qwen2
from transformers import AutoModelForCausalLM

import learners.update as U
from exgrpo.core import metric_names as M
from exgrpo.core.config import LossConfig
from exgrpo.core.records import Group, Trajectory
from learners import batches
from learners.engine import ModelEngine
from learners.logits import per_token

torch.set_num_threads(1)
VERSION = 3


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(
        save_tiny_qwen2(tmp_path_factory, seed=4, name="tiny-gap")
    ).eval()


def _groups(model: torch.nn.Module) -> tuple[Group, ...]:
    """4 groups of K=4 whose fresh rows carry the model's own log-probs (a sampler on the learner's weights):
    group 0 is a replay group (slot 0 replayed, garbage log-probs), group 1 was sampled at VERSION - 1
    (garbage log-probs), group 3's last row changed version mid-response (its first 2 tokens at VERSION - 1,
    garbage)."""
    g = torch.Generator().manual_seed(0)
    out = []
    for i in range(4):
        trajs = []
        for k in range(4):
            n = 2 + (3 * i + k) % 5
            ids = tuple(torch.randint(1, 64, (n,), generator=g).tolist())
            trajs.append(
                Trajectory(f"q{i}", ids, (0.0,) * n, float(k % 2), VERSION, replayed=i == 0 and k == 0)
            )
        out.append(Group(f"q{i}", tuple(range(1, 3 + i)), tuple(trajs), "replay" if i == 0 else "fresh",
                         request_id=10 + i, policy_version=VERSION))  # fmt: skip
    rows, _ = batches.build_rows(out, std_normalize=False)
    r_max = max(len(r.response_ids) for r in rows)
    exact = per_token(model, rows, r_max, "logp", slices=[slice(0, len(rows))], device=torch.device("cpu"))
    i = 0
    for gi, grp in enumerate(out):
        trajs = []
        for k, t in enumerate(grp.trajectories):
            n = len(t.response_ids)
            lps = tuple(exact[i, :n].tolist())
            if t.replayed or gi == 1:
                lps = tuple(x - 5.0 for x in lps)
            spans: tuple[tuple[int, int], ...] = ()
            if gi == 3 and k == 3:
                lps = tuple(x - 5.0 if j < 2 else x for j, x in enumerate(lps))
                spans = ((0, VERSION - 1), (2, VERSION))
            version = VERSION - 1 if gi == 1 or spans else VERSION
            trajs.append(replace(t, logprobs=lps, policy_version=version, version_spans=spans))
            i += 1
        out[gi] = replace(grp, trajectories=tuple(trajs))
    return tuple(out)


def _update(model, groups, *, minibatches: int) -> tuple[dict[str, float], list]:
    gaps: list = []
    engine = ModelEngine(model, micro_batch_size=3)
    metrics = U.update(engine, groups, loss=LossConfig(), minibatches=minibatches, max_response_len=8, clip=True,
                       version=VERSION, gap_bound=0.5, gaps=gaps)  # fmt: skip
    model.zero_grad(set_to_none=True)
    return metrics, gaps


def _compared(groups) -> dict[int, int]:
    """Request id -> its fresh tokens sampled at VERSION."""
    return {
        g.request_id: sum(v == VERSION for t in g.trajectories if not t.replayed for v in t.token_versions())
        for g in groups
    }


@pytest.mark.parametrize("minibatches", [1, 2])  # the single mini-batch's forward, or the proximal pass
def test_the_gap_covers_only_fresh_tokens_sampled_at_the_learners_version(model, minibatches):
    groups = _groups(model)
    metrics, gaps = _update(model, groups, minibatches=minibatches)
    want = {rid: n for rid, n in _compared(groups).items() if n}
    assert 1 not in want and want[13] == sum(len(t.response_ids) for t in groups[3].trajectories) - 2
    assert metrics[M.LOGPROB_GAP_TOKENS] == sum(want.values())
    assert metrics[M.LOGPROB_GAP_MEAN] < 1e-5 and metrics[M.LOGPROB_GAP_P99] < 1e-5  # the same weights
    assert metrics[M.LOGPROB_GAP_OVER] == 0.0
    assert {rid: n for rid, n, _, over in gaps} == want and all(over == 0 for *_, over in gaps)


def test_a_request_off_by_one_nat_is_past_the_bound(model):
    groups = list(_groups(model))
    bad = groups[2]
    groups[2] = replace(
        bad,
        trajectories=tuple(replace(t, logprobs=tuple(x + 1.0 for x in t.logprobs)) for t in bad.trajectories),
    )
    metrics, gaps = _update(model, tuple(groups), minibatches=1)
    n_bad = _compared(groups)[12]
    assert metrics[M.LOGPROB_GAP_OVER] == pytest.approx(n_bad / metrics[M.LOGPROB_GAP_TOKENS])
    assert metrics[M.LOGPROB_GAP_MEAN] == pytest.approx(n_bad / metrics[M.LOGPROB_GAP_TOKENS], rel=1e-4)
    assert metrics[M.LOGPROB_GAP_P99] == pytest.approx(1.0, rel=0.13)
    row = next(r for r in gaps if r[0] == 12)
    assert row[1] == row[3] == n_bad and row[2] == pytest.approx(n_bad, rel=1e-4)


def test_the_histogram_p99_and_the_sum_over_ranks():
    rng = np.random.default_rng(1)
    values = rng.lognormal(-4, 2, size=(8, 50))
    groups = [
        Group(f"q{i}", (1,), (Trajectory(f"q{i}", (1,) * 50, (0.0,) * 50, 0.0, 0),), request_id=i)
        for i in range(8)
    ]
    current, behaviour = torch.tensor(values), torch.zeros(8, 50)
    one, _ = U.logprob_gap(groups, list(range(9)), current, behaviour, version=0, bound=0.1,
                           all_reduce=lambda t: None, device=torch.device("cpu"))  # fmt: skip
    exact = float(np.quantile(values, 0.99))
    assert exact <= one[M.LOGPROB_GAP_P99] <= exact * 10**0.05 * 1.0001  # the upper edge of its bin
    assert one[M.LOGPROB_GAP_MEAN] == pytest.approx(values.mean())
    assert one[M.LOGPROB_GAP_OVER] == pytest.approx((values > 0.1).mean())
    two, _ = U.logprob_gap(groups, list(range(9)), current, behaviour, version=0, bound=0.1,
                           all_reduce=lambda t: t.mul_(2), device=torch.device("cpu"))  # fmt: skip
    assert two[M.LOGPROB_GAP_TOKENS] == 2 * one[M.LOGPROB_GAP_TOKENS] == 800  # two ranks with the same tokens
    for key in (M.LOGPROB_GAP_MEAN, M.LOGPROB_GAP_P99, M.LOGPROB_GAP_OVER):
        assert two[key] == pytest.approx(one[key])
    none, rows = U.logprob_gap(groups, list(range(9)), current, behaviour, version=5, bound=0.1,
                               all_reduce=lambda t: None, device=torch.device("cpu"))  # fmt: skip
    assert none[M.LOGPROB_GAP_TOKENS] == 0 and math.isnan(none[M.LOGPROB_GAP_MEAN]) and rows == []
