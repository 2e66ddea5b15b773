"""LoRA through PEFT and the KL penalty to the initial policy, on real DeepSpeed engines (CPU, gloo).

The tiny Qwen2 of ``tiny_qwen2`` (hidden 64, MLP 128, 2 layers); the groups and per-row statistics of
``test_learner``.
"""

from __future__ import annotations

import os
from dataclasses import replace

os.environ.setdefault("TORCH_EXTENSIONS_DIR", os.path.expanduser("~/.cache/exgrpo/torch_extensions"))

import pytest  # noqa: E402
import torch  # noqa: E402
from test_learner import MAX_LEN, _groups, _row_stats  # noqa: E402
from tiny_qwen2 import save_tiny_qwen2  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

from exgrpo.core import metric_names as M  # noqa: E402
from exgrpo.core.algorithm import kl_k3, token_logprobs  # noqa: E402
from exgrpo.core.config import LORA_TARGETS, LearnerConfig, LossConfig  # noqa: E402
from exgrpo.core.records import TrainBatch  # noqa: E402
from exgrpo.transport.packed import unpack_weights  # noqa: E402
from learners import (
    batches,  # noqa: E402
    logits,  # noqa: E402
    lora,  # noqa: E402
)
from learners import update as U  # noqa: E402
from learners.diagnostics import gradient_shares  # noqa: E402
from learners.engine import ModelEngine  # noqa: E402
from learners.learner import Learner  # noqa: E402

torch.set_num_threads(1)
RANK, ALPHA = 4, 8.0


@pytest.fixture(scope="module")
def model_path(tmp_path_factory) -> str:
    return save_tiny_qwen2(tmp_path_factory, seed=0, name="tiny-qwen2-lora")


def _learner(path: str, *, kl_coef: float = 0.0, rank: int = RANK, lr: float = 1e-2, **cfg) -> Learner:
    learner = Learner(
        model_path=path,
        learner=LearnerConfig(
            lr=lr, micro_batch_size=3, lora_rank=rank, lora_alpha=ALPHA, **{"zero_stage": 0, **cfg}
        ),
        loss=LossConfig(kl_coef=kl_coef),
        max_response_len=MAX_LEN,
    )
    learner.setup()
    return learner


def _named(learner: Learner) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in learner.engine.module.named_parameters()}


def test_only_the_adapters_train_and_their_count_is_analytic(model_path):
    learner = _learner(model_path)
    base = AutoModelForCausalLM.from_pretrained(model_path)
    targeted = [
        m
        for name, m in base.named_modules()
        if isinstance(m, torch.nn.Linear) and name.split(".")[-1] in LORA_TARGETS
    ]
    want = sum(RANK * (m.in_features + m.out_features) for m in targeted)  # A: r x d_in, B: d_out x r
    full = sum(p.numel() for p in base.parameters())
    print(f"LoRA r={RANK} on {len(targeted)} Linear layers: {learner.num_trainable()} trainable of {full}")
    assert len(targeted) == 14 and learner.num_trainable() == want == 8704
    assert learner.num_parameters() == full
    optimised = {id(p) for g in learner.optimizer.param_groups for p in g["params"]}
    adapters = {id(p) for n, p in learner.engine.module.named_parameters() if ".lora_" in n}
    assert optimised == adapters

    before = _named(learner)
    learner.update(TrainBatch(groups=_groups(0), version=0, clip=True))
    after = _named(learner)
    changed = {n for n in before if not torch.equal(before[n], after[n])}
    assert changed and all(".lora_" in n for n in changed)
    assert all(n in changed for n in before if ".lora_B." in n)  # every B moved off zero


def test_merged_weights_are_w_plus_scaled_ba_under_base_names(model_path):
    learner = _learner(model_path)
    for v in range(2):  # two steps: B != 0 after the first, so A moves by its gradient in the second
        learner.update(TrainBatch(groups=_groups(v), version=v, clip=True))
    adapters = _named(learner)
    packed = unpack_weights(learner.get_weights())
    base = AutoModelForCausalLM.from_pretrained(model_path)
    assert [(k, tuple(v.shape)) for k, v in packed.items()] == [
        (k, tuple(v.shape)) for k, v in base.state_dict().items()
    ]
    merged = 0
    for name, value in packed.items():
        owner = name.removesuffix(".weight")
        prefix = f"base_model.model.{owner}"
        if name.endswith(".weight") and owner.split(".")[-1] in LORA_TARGETS:
            a, b = adapters[f"{prefix}.lora_A.default.weight"], adapters[f"{prefix}.lora_B.default.weight"]
            assert float(b.abs().max()) > 0
            assert torch.equal(value, base.state_dict()[name] + (ALPHA / RANK) * (b @ a)), name
            merged += 1
        else:
            assert torch.equal(value, base.state_dict()[name]), name
    assert merged == 14
    assert all(torch.equal(adapters[n], p) for n, p in learner.engine.module.named_parameters())  # untouched
    # a plain HF model holding the merged weights computes what the adapted model computes
    base.load_state_dict(packed)
    ids = torch.tensor([[1, 2, 3, 4, 5, 6]])
    with torch.no_grad():
        torch.testing.assert_close(base(input_ids=ids).logits, learner.engine.module(input_ids=ids).logits)
    assert learner.checksum() == pytest.approx(
        sum(float(p.detach().double().sum()) for p in base.parameters()), rel=1e-12
    )
    # the collective transport's source: the base's parameter names, refreshed values
    view = lora.MergedView(learner.engine.module)
    assert list(dict(view.named_parameters())) == list(dict(base.named_parameters()))
    learner.update(TrainBatch(groups=_groups(2), version=2, clip=True))
    view.refresh()
    fresh = unpack_weights(learner.get_weights())
    assert all(torch.equal(t, fresh[n]) for n, t in view.named_parameters())


@pytest.mark.parametrize("rank", [RANK, 0])
def test_checkpoint_round_trip_and_resume_from_merged_weights(model_path, tmp_path, rank):
    """LoRA (adapters on the recorded base), and full fine-tuning's KL reference (the recorded initial model)."""
    lr = 1e-2 if rank else 1e-3
    a = _learner(model_path, kl_coef=0.1, rank=rank, lr=lr)
    for v in range(2):
        a.update(TrainBatch(groups=_groups(6 + v), version=v, clip=True))
    a.save(path=str(tmp_path / "ckpt"))
    assert (tmp_path / "ckpt" / "adapter" / "adapter_config.json").is_file() == bool(rank)
    # b: a learner on the base (a plain load); c: on the checkpoint's trained weights (a resumed run)
    b = _learner(model_path, kl_coef=0.1, rank=rank, lr=lr)
    c = _learner(str(tmp_path / "ckpt"), kl_coef=0.1, rank=rank, lr=lr)
    for learner in (b, c):
        learner.load(path=str(tmp_path / "ckpt"))
        assert learner.version() == 2
        assert all(
            torch.equal(x, y) for x, y in zip(learner.served().values(), a.served().values(), strict=True)
        )
    assert c._initial_path == model_path  # the base came back from where the run started
    # equal next steps need equal moments, bases and KL references
    kls = [
        learner.update(TrainBatch(groups=_groups(9), version=2, clip=True)).metrics[M.KL]
        for learner in (a, b, c)
    ]
    assert kls[0] > 0 and kls == [kls[0]] * 3
    want = unpack_weights(a.get_weights())
    for learner in (b, c):
        got = unpack_weights(learner.get_weights())
        assert all(torch.equal(want[n], got[n]) for n in want)


@pytest.mark.parametrize("rank", [0, RANK])
def test_kl_is_zero_at_the_initial_policy_and_grows(model_path, rank):
    learner = _learner(model_path, kl_coef=0.05, rank=rank, lr=1e-2 if rank else 1e-3)
    kls = [
        learner.update(TrainBatch(groups=_groups(1, replay=False), version=v, clip=False)).metrics[M.KL]
        for v in range(3)
    ]
    assert kls[0] == 0.0  # one mini-batch: its forward runs at the initial weights
    assert 0 < kls[1] < kls[2]
    plain = Learner(
        model_path=model_path, learner=LearnerConfig(lr=1e-3), loss=LossConfig(), max_response_len=MAX_LEN
    )
    plain.setup()
    assert (
        M.KL not in plain.update(TrainBatch(groups=_groups(1), version=0, clip=True)).metrics
    )  # off by default


def test_kl_k3_value_and_gradient():
    logp = torch.tensor([[-1.0, -2.0, 0.0], [-0.5, 0.0, 0.0]], requires_grad=True)
    ref = torch.tensor([[-1.5, -1.0, 9.0], [-0.5, 0.0, 0.0]])
    mask = torch.tensor([[True, True, False], [True, False, False]])
    d = torch.tensor([-0.5, 1.0, 0.0])  # ref - logp on the three response tokens
    k3 = torch.exp(d) - d - 1
    value = kl_k3(logp, ref, mask, norm_len=4)
    assert float(value) == pytest.approx(float((k3[0] + k3[1]) / 4 + k3[2] / 4) / 2)
    value.backward()
    grad = (1 - torch.exp(d)) / 4 / 2  # d k3 / d logp, over L = 4 and N = 2 rows
    torch.testing.assert_close(logp.grad, torch.tensor([[grad[0], grad[1], 0.0], [grad[2], 0.0, 0.0]]))
    assert float(kl_k3(logp, ref, mask, norm_len=None)) == pytest.approx(float(k3.sum() / 3))


def test_kl_term_is_in_the_accumulated_gradient(model_path):
    """The gradient with kl_coef = c minus the one with c = 0 is c times the gradient of the mini-batch's KL,
    computed here from unpadded per-row forwards against a perturbed reference."""
    model = AutoModelForCausalLM.from_pretrained(model_path).eval()
    ref = AutoModelForCausalLM.from_pretrained(model_path).eval()
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(0.05 * torch.randn_like(p))
    groups, c = _groups(3), 0.3

    @torch.no_grad()
    def reference(enc: batches.Encoded) -> torch.Tensor:
        return token_logprobs(logits.response_logits(ref, enc), enc.tokens)

    def grads(kl_coef: float) -> list[torch.Tensor]:
        model.zero_grad()
        engine = ModelEngine(model, micro_batch_size=3, reference=reference if kl_coef else None)
        U.update(
            engine,
            groups,
            loss=LossConfig(kl_coef=kl_coef),
            minibatches=1,
            max_response_len=MAX_LEN,
            clip=True,
        )
        return [p.grad.clone() for p in model.parameters()]

    with_kl, without = grads(c), grads(0.0)
    model.zero_grad()
    rows = [(g.prompt_ids, t.response_ids) for g in groups for t in g.trajectories]
    total = 0.0
    for prompt, response in rows:
        logp = _row_stats(model, prompt, response)[0]
        with torch.no_grad():
            ref_logp = _row_stats(ref, prompt, response)[0]
        d = ref_logp - logp
        total = total + (torch.exp(d) - d - 1).sum() / MAX_LEN / len(rows)
    total.backward()
    assert float(total) > 1e-4
    for p, a, b in zip(model.parameters(), with_kl, without, strict=True):
        torch.testing.assert_close(a - b, c * p.grad, rtol=1e-4, atol=1e-7)


def test_gradient_shares_under_lora(model_path):
    learner = _learner(model_path)
    learner.update(
        TrainBatch(groups=_groups(4), version=0, clip=True)
    )  # B != 0: the adapters' gradient is not degenerate
    out = gradient_shares(
        learner.engine.module,
        _groups(5),
        loss=LossConfig(),
        max_response_len=MAX_LEN,
        clip=True,
        device=torch.device("cpu"),
    )
    shares = out[M.GRAD_SHARE_STORED] + out[M.GRAD_SHARE_REPLAY_FRESH] + out[M.GRAD_SHARE_FRESH]
    assert out[M.GRAD_NORM_PG] > 0 and shares == pytest.approx(1.0, abs=1e-9)


@pytest.mark.integration
def test_two_lora_learners_under_zero2_match_one_learner(ray_cluster, model_path):
    """ZeRO-2 partitions only the adapters' fp32 copies and moments; the frozen base stays whole on each rank."""
    import ray

    from exgrpo.runtime.env import remote_actor
    from learners.group import LearnerGroup

    cfg = LearnerConfig(num=2, zero_stage=2, lr=1e-2, micro_batch_size=3, lora_rank=RANK, lora_alpha=ALPHA)
    loss = LossConfig(norm="token_mean", kl_coef=0.1)
    group = LearnerGroup(
        num=2,
        make_actor=remote_actor,
        model_path=model_path,
        learner_cfg=cfg,
        loss_cfg=loss,
        max_response_len=MAX_LEN,
    )
    single = Learner(
        model_path=model_path, learner=replace(cfg, num=1, zero_stage=0), loss=loss, max_response_len=MAX_LEN
    )
    single.setup()
    try:
        for step in range(3):
            batch = TrainBatch(groups=_groups(10 + step), version=step, clip=True)
            got, want = (
                group.update(batch=batch).metrics,
                single.update(TrainBatch(groups=batch.groups, version=step, clip=True)).metrics,
            )
            assert got[M.GRAD_NORM] == pytest.approx(want[M.GRAD_NORM], rel=1e-5)
            assert (got[M.KL] > 0) == (want[M.KL] > 0) == (step > 0)  # a mean of the ranks' own KL means
        sums = group.checksums()
        assert sums[0] == sums[1] == pytest.approx(single.checksum(), rel=1e-6)
        got_w, want_w = unpack_weights(ray.get(group.get_weights_ref())), unpack_weights(single.get_weights())
        for name in want_w:
            torch.testing.assert_close(got_w[name], want_w[name], rtol=0, atol=1e-4)  # 1% of one Adam step
    finally:
        group.shutdown()
