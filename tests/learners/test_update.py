"""``learners.update``: the plain-torch update is the ``Learner``'s, and the device check runs it.

The same tiny Qwen2 trains once through ``Learner.update`` (a DeepSpeed ZeRO-0 engine, CPU, gloo) and once
through ``learners.update.update`` on the bare HF model with the same client optimiser (``GuardedAdamW``):
the metrics, the accumulated gradients handed to each optimiser step and the weights after each step agree
(on CPU at world size 1 they are bitwise equal: the engine's backward is the model's, averaged over 1 rank).
"""

from __future__ import annotations

import ast
import math
import os
from collections.abc import Callable, Sequence
from pathlib import Path

os.environ.setdefault("TORCH_EXTENSIONS_DIR", os.path.expanduser("~/.cache/exgrpo/torch_extensions"))

import pytest  # noqa: E402
import torch  # noqa: E402
from tiny_qwen2 import save_tiny_qwen2  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

import learners.update as U  # noqa: E402
from exgrpo.core import metric_names as M  # noqa: E402
from exgrpo.core.config import LearnerConfig, LossConfig  # noqa: E402
from exgrpo.core.records import Group, TrainBatch, Trajectory  # noqa: E402
from learners import batches  # noqa: E402
from learners.diagnostics import gradient_shares  # noqa: E402
from learners.engine import UpdateEngine  # noqa: E402
from learners.learner import Learner  # noqa: E402
from learners.optim import make_optimizer  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
torch.set_num_threads(1)
MAX_LEN = 8
METRICS = (
    M.LOSS,
    M.PG_LOSS,
    M.ENTROPY,
    M.GRAD_NORM,
    M.CLIP_FRAC,
    M.RATIO_FRESH,
    M.RATIO_REPLAY,
    M.APPROX_KL,
    M.SKIPPED_STEPS,
    M.LEARNER_TOKENS,
)


@pytest.fixture(scope="module")
def model_path(tmp_path_factory) -> str:
    return save_tiny_qwen2(tmp_path_factory, seed=2, name="tiny-qwen2-update")


def _groups(seed: int) -> tuple[Group, ...]:
    """4 groups of K=4, response lengths 1..7, prompts of 1..4 tokens, mixed rewards (group 3 all 0);
    group 0 is a replay group whose slot 0 is replayed with stored log-probs far from the model's."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(4):
        trajs = []
        for k in range(4):
            n = 1 + (5 * i + 3 * k + seed) % 7
            replayed = i == 0 and k == 0
            lp = -3.0 if replayed else -4.4
            trajs.append(
                Trajectory(
                    qid=f"q{i}",
                    response_ids=tuple(torch.randint(1, 64, (n,), generator=g).tolist()),
                    logprobs=tuple(lp + 0.05 * t for t in range(n)),
                    reward=0.0 if i == 3 else float((i + k) % 3 == 0),
                    policy_version=0,
                    replayed=replayed,
                )
            )
        out.append(
            Group(
                qid=f"q{i}",
                prompt_ids=tuple(range(1, 2 + i)),
                trajectories=tuple(trajs),
                kind="replay" if i == 0 else "fresh",
            )
        )
    return tuple(out)


class FakeEngine:
    """A small `UpdateEngine` over the bare model on one process: micro-batches of `size` rows, the plain
    backward, the caller's `step`; records the accumulation boundaries it is told."""

    world_size = 1
    has_reference = False

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        size: int,
        step: Callable[[], tuple[float, bool]],
        chunk_tokens: int | None = None,
        pack: bool = False,
    ) -> None:
        self.module, self.device, self.chunk_tokens = model, torch.device("cpu"), chunk_tokens
        self.size, self._step, self.pack = size, step, pack
        self.boundaries: list[bool] = []

    def micro_batches(self, rows: Sequence[batches.Row]) -> list[slice]:
        return batches.chunks(len(rows), self.size)

    def boundary(self, last: bool) -> None:
        self.boundaries.append(last)

    def backward(self, objective: torch.Tensor) -> None:
        objective.backward()

    def step(self) -> tuple[float, bool]:
        return self._step()

    def all_reduce(self, tensor: torch.Tensor) -> None:
        pass

    def reference_logprobs(self, enc: batches.Encoded) -> torch.Tensor:
        raise AssertionError("no reference policy: loss.kl_coef is 0")


_: UpdateEngine = FakeEngine(torch.nn.Linear(1, 1), size=1, step=lambda: (0.0, False))  # the fake is one


def _record_grads(optimizer, seen: list[list[torch.Tensor]]) -> None:
    """Wrap ``optimizer.step`` to record the gradients it is handed (before the grad-norm rule)."""
    inner = optimizer.step

    def step(*args, **kwargs):  # noqa: ANN002, ANN003
        params = [p for g in optimizer.param_groups for p in g["params"]]
        seen.append([p.grad.detach().clone() for p in params])
        return inner(*args, **kwargs)

    optimizer.step = step


CASES = {
    # two mini-batches (the no-grad proximal pass) with a TIS weight, token-mean normaliser, clipping,
    # micro-batches of 3 (uneven: 3, 3, 2); std-normalised advantages
    "two_minibatches_tis": (
        dict(minibatches=2, micro_batch_size=3, grad_clip=0.1),
        LossConfig(norm="token_mean", entropy_coef=0.01, tis_cap=1.2, std_normalize=True),
        True,
    ),
    # one mini-batch, no TIS: the proximal pass is skipped (the forward's own log-probs); constant normaliser
    "one_minibatch_reuse": (
        dict(minibatches=1, micro_batch_size=5),
        LossConfig(norm="constant", entropy_coef=0.01),
        False,
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_pure_update_matches_learner(model_path, case):
    cfg_kw, loss, clip = CASES[case]
    cfg = LearnerConfig(lr=1e-3, zero_stage=0, **cfg_kw)
    learner = Learner(model_path=model_path, learner=cfg, loss=loss, max_response_len=MAX_LEN)
    assert "packed" in learner.setup()  # learners.pack_prompts=auto on a CPU learner
    assert learner.engine.optimizer is learner.optimizer  # ZeRO-0, fp32: the client optimiser itself
    theirs: list[list[torch.Tensor]] = []
    _record_grads(learner.optimizer, theirs)

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    model.config.use_cache = False
    opt = make_optimizer(model, cfg)
    ours: list[list[torch.Tensor]] = []
    _record_grads(opt, ours)

    def step() -> tuple[float, bool]:
        opt.begin()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return opt.last_grad_norm, opt.overflow

    for version in range(2):  # the second update starts from moved weights and Adam moments
        groups = _groups(version)
        want = learner.update(TrainBatch(groups=groups, version=version, clip=clip)).metrics
        # the learner's logits path (bit-equal only on the same one)
        engine = FakeEngine(
            model,
            size=cfg.micro_batch_size,
            step=step,
            chunk_tokens=cfg.logits_chunk_tokens,
            pack=learner.plan.pack,
        )
        got = U.update(
            engine, groups, loss=loss, minibatches=cfg.minibatches, max_response_len=MAX_LEN, clip=clip
        )
        # one boundary per micro-batch forward, the last of each mini-batch marked
        assert engine.boundaries.count(True) == cfg.minibatches and engine.boundaries[-1]
        assert set(want) == set(got) | {M.LEARNER_SELECT_TIME}  # the learner also reports its scoring time
        for key in METRICS:
            a, b = got[key], want[key]
            assert (math.isnan(a) and math.isnan(b)) or a == b, (key, a, b)
        assert got[M.SKIPPED_STEPS] == 0 and math.isfinite(got[M.GRAD_NORM])
        assert learner.version() == version + 1
    assert len(ours) == len(theirs) == 2 * cfg.minibatches
    for g_ours, g_theirs in zip(ours, theirs, strict=True):
        assert any(float(g.abs().sum()) > 0 for g in g_ours)
        for a, b in zip(g_ours, g_theirs, strict=True):
            assert torch.equal(a, b)
    ref = learner.engine.module.state_dict()
    for name, value in model.state_dict().items():
        assert torch.equal(value, ref[name]), name


def test_old_logprobs_follows_the_reuse_rule():
    rows = [
        batches.Row((1,), (2, 3), (-1.0, -2.0), replayed=True, advantage=0.5),
        batches.Row((1, 2), (4,), (-3.0,), replayed=False, advantage=-0.5),
    ]
    assert U.reuses_proximal(minibatches=1, tis_cap=None)
    assert not U.reuses_proximal(minibatches=2, tis_cap=None)
    assert not U.reuses_proximal(minibatches=1, tis_cap=2.0)
    assert not U.reuses_proximal(minibatches=1, tis_cap=None, reuse=False)
    behaviour, tis = U.old_logprobs(rows, 2, None, tis_cap=None)
    assert tis is None and torch.equal(behaviour, torch.tensor([[-1.0, -2.0], [-3.0, 0.0]]))
    proximal = torch.tensor([[-5.0, -5.0], [-2.5, 0.0]])  # (N, R)
    old, tis = U.old_logprobs(rows, 2, proximal, tis_cap=1.5)
    assert torch.equal(old, torch.tensor([[-1.0, -2.0], [-2.5, 0.0]]))  # replayed: stored; fresh: proximal
    assert torch.allclose(tis[1], torch.tensor([min(math.exp(0.5), 1.5), 1.0]))
    assert U.minibatch_slices([0, 4, 8, 12, 16], 2) == [slice(0, 8), slice(8, 16)]
    enc = batches.encode(rows, 2, torch.device("cpu"))
    assert enc.positions.tolist() == [[0, 1], [1, 0]] and enc.mask.tolist() == [[True, True], [True, False]]


def test_device_check_runs_the_projects_learner():
    """The device check's learner part (`check_learner` and its update loop in bench/learner/gpu_learner.py, the
    learner started by device_shapes.py's `start_learner`) trains through learners.learner.Learner and defines or
    calls no loss of its own."""
    files = [
        ROOT / "bench" / "learner" / f for f in ("device_check.py", "gpu_learner.py", "device_shapes.py")
    ]
    trees = [ast.parse(f.read_text()) for f in files]
    imported = {
        (node.module, a.name)
        for tree in trees
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
        for a in node.names
    }
    assert ("learners.learner", "Learner") in imported
    assert ("bench.learner.gpu_learner", "check_learner") in imported
    assert ("bench.learner.device_shapes", "start_learner") in imported
    assert not any(m in ("exgrpo.core.algorithm", "learners.update") for m, _ in imported)
    called = {
        node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", None)
        for tree in trees
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
    }
    assert {"Learner", "setup", "update"} <= called
    loss_parts = {"exgrpo_loss", "token_logprobs", "token_entropy", "group_advantages", "masked_mean"}
    assert called & loss_parts == set()


def test_gradient_shares_split_the_policy_gradient_exactly(model_path):
    """stored + replay-fresh + fresh gradients add up to the update's policy gradient (entropy off)."""
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    groups = _groups(0)
    loss = LossConfig(norm="constant", entropy_coef=0.0)
    shares = gradient_shares(
        model, groups, loss=loss, max_response_len=8, clip=False, device=torch.device("cpu")
    )
    assert all(p.grad is None for p in model.parameters())  # nothing accumulated
    engine = FakeEngine(model, size=5, step=lambda: (0.0, False))  # keep the accumulated gradient, no step
    U.update(engine, groups, loss=loss, minibatches=1, max_response_len=8, clip=False)
    full = torch.cat([p.grad.reshape(-1).double() for p in model.parameters()])
    assert shares[M.GRAD_NORM_PG] == pytest.approx(float(full.norm()), rel=1e-5)
    parts = (M.GRAD_SHARE_STORED, M.GRAD_SHARE_REPLAY_FRESH, M.GRAD_SHARE_FRESH)
    assert sum(shares[k] for k in parts) == pytest.approx(1.0, abs=1e-9)
    assert (
        shares[M.GRAD_NORM_STORED] > 0
        and shares[M.GRAD_NORM_REPLAY_FRESH] > 0
        and shares[M.GRAD_NORM_FRESH] > 0
    )
    fresh_only = gradient_shares(
        model, groups[1:], loss=loss, max_response_len=8, clip=True, device=torch.device("cpu")
    )
    assert fresh_only[M.GRAD_NORM_STORED] == 0.0 and fresh_only[M.GRAD_SHARE_FRESH] == pytest.approx(1.0)
