"""Learner on real DeepSpeed engines (CPU, gloo) against an independent plain-torch reference.

The first DeepSpeed initialize on a machine compiles a small op (~40-90 s); it is cached under
TORCH_EXTENSIONS_DIR, which this module points at ~/.cache/exgrpo/torch_extensions before DeepSpeed loads.
"""

from __future__ import annotations

import math
import os
from dataclasses import replace

os.environ.setdefault("TORCH_EXTENSIONS_DIR", os.path.expanduser("~/.cache/exgrpo/torch_extensions"))

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from tiny_qwen2 import save_tiny_qwen2  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

from exgrpo.core import metric_names as M  # noqa: E402
from exgrpo.core.algorithm import exgrpo_loss, token_entropy, token_logprobs  # noqa: E402
from exgrpo.core.config import LearnerConfig, LossConfig  # noqa: E402
from exgrpo.core.records import Group, ReplayCandidate, TrainBatch, Trajectory  # noqa: E402
from exgrpo.core.selection import place_picks, replay_candidates, replay_picks  # noqa: E402
from exgrpo.transport.packed import PackedWeights, unpack_weights  # noqa: E402
from learners.learner import Learner  # noqa: E402

torch.set_num_threads(1)
MAX_LEN = 8  # max_response_len: the constant normaliser


@pytest.fixture(scope="module")
def model_path(tmp_path_factory) -> str:
    """A random tiny Qwen2 (vocab 64, hidden 64, 2 layers, 2 heads of dim 32), no tokenizer."""
    return save_tiny_qwen2(tmp_path_factory, seed=0, name="tiny-qwen2")


def _traj(seed: int, n: int, reward: float, *, replayed: bool = False, logprob: float = -4.5) -> Trajectory:
    g = torch.Generator().manual_seed(seed)
    ids = tuple(torch.randint(1, 64, (n,), generator=g).tolist())
    lps = tuple(logprob + 0.1 * k for k in range(n))  # behaviour log-probs, distinct per token
    return Trajectory(
        qid=f"q{seed}", response_ids=ids, logprobs=lps, reward=reward, policy_version=0, replayed=replayed
    )


def _groups(seed: int = 0, *, replay: bool = True, n: int = 4) -> tuple[Group, ...]:
    """n groups of K=4: response lengths 2..6 (group token totals 14, 16, 18, 15), mixed rewards, one
    all-correct group (A = 0), group 0 mixed (slot 0 replayed with stored log-probs -3.0 + 0.1 t)."""
    out = []
    for i in range(n):
        s = 100 * seed + 10 * i
        rewards = [1.0, 1.0, 1.0, 1.0] if i == 2 else [1.0, 0.0, float(i % 2), 0.0]
        trajs = tuple(
            _traj(
                s + k,
                2 + (3 * i + k) % 5,
                rewards[k],
                replayed=replay and i == 0 and k == 0,
                logprob=-3.0 if replay and i == 0 and k == 0 else -4.5,
            )
            for k in range(4)
        )
        out.append(
            Group(
                qid=f"q{i}",
                prompt_ids=tuple(range(1, 3 + i % 2 + 1)),
                trajectories=trajs,
                kind="replay" if replay and i == 0 else "fresh",
            )
        )
    return tuple(out)


def _learner(path: str, *, loss: LossConfig | None = None, **cfg) -> Learner:
    base = dict(lr=1e-3, micro_batch_size=3, minibatches=1, zero_stage=0)
    learner = Learner(
        model_path=path,
        learner=LearnerConfig(**{**base, **cfg}),
        loss=loss or LossConfig(),
        max_response_len=MAX_LEN,
    )
    learner.setup()
    return learner


def _row_stats(
    model, prompt: tuple[int, ...], response: tuple[int, ...]
) -> tuple[torch.Tensor, torch.Tensor]:
    """(logp, entropy) of each response token from one unpadded forward: logits at p-1 .. p+r-2."""
    ids = torch.tensor([prompt + response])
    logits = model(input_ids=ids).logits[0, len(prompt) - 1 : len(prompt) + len(response) - 1]  # (R, V)
    return token_logprobs(logits[None], torch.tensor([response]))[0], token_entropy(logits)


def _reference(path: str, groups, *, cfg: LearnerConfig, loss: LossConfig, clip: bool):
    """Plain torch: per-row forwards, exgrpo_loss over each whole mini-batch, clip, torch AdamW."""
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay)
    rows = []
    for g in groups:
        r = torch.tensor([t.reward for t in g.trajectories])
        for t, a in zip(g.trajectories, (r - r.mean()).tolist(), strict=True):  # Dr.GRPO: A = r - mean
            rows.append((g.prompt_ids, t, a))
    r_max = max(len(t.response_ids) for _, t, _ in rows)

    def pad(vals):  # list of (R_i,) -> (N, r_max)
        return torch.stack([torch.nn.functional.pad(v, (0, r_max - len(v))) for v in vals])

    with torch.no_grad():
        proximal = [_row_stats(model, p, t.response_ids)[0] for p, t, _ in rows]
    norms = []
    per = len(rows) // cfg.minibatches
    for m in range(cfg.minibatches):
        mb = rows[m * per : (m + 1) * per]
        stats = [_row_stats(model, p, t.response_ids) for p, t, _ in mb]
        stored = [torch.tensor(t.logprobs) for _, t, _ in mb]
        prox = proximal[m * per : (m + 1) * per]
        old = [s if t.replayed else q for s, q, (_, t, _) in zip(stored, prox, mb, strict=True)]
        tis = None
        if loss.tis_cap is not None:
            tis = pad([torch.exp(q - s).clamp(max=loss.tis_cap) for q, s in zip(prox, stored, strict=True)])
        total, _ = exgrpo_loss(
            logp=pad([s[0] for s in stats]),
            old_logp=pad(old),
            advantages=torch.tensor([a for *_, a in mb]),
            response_mask=pad([torch.ones(len(t.response_ids), dtype=torch.bool) for _, t, _ in mb]),
            replayed=torch.tensor([t.replayed for _, t, _ in mb]),
            clip=clip,
            norm_len=MAX_LEN if loss.norm == "constant" else None,
            cfg=loss,
            entropy=pad([s[1] for s in stats]),
            tis_weight=tis,
        )
        total.backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)))
        opt.step()
        opt.zero_grad()
    return {k: v.detach().numpy() for k, v in model.state_dict().items()}, norms


def _numpy(w: dict | PackedWeights) -> dict:
    return {k: v.numpy() for k, v in unpack_weights(w).items()} if isinstance(w, PackedWeights) else w


def _assert_weights_close(a: dict | PackedWeights, b: dict | PackedWeights, atol: float) -> None:
    """Equal names and values. Key biases are skipped when atol > 0: softmax is shift-invariant, so
    their true gradient is 0 and Adam (g / (|g| + 1e-8)) turns float noise of ~1e-9 into ~lr/10 steps."""
    a, b = _numpy(a), _numpy(b)
    assert list(a) == list(b)
    for k in a:
        if atol > 0 and k.endswith("k_proj.bias"):
            continue
        np.testing.assert_allclose(a[k], b[k], rtol=0, atol=atol, err_msg=k)


@pytest.mark.parametrize("norm", ["constant", "token_mean"])
def test_update_matches_plain_torch_reference(model_path, norm):
    # 2 mini-batches of 8 rows in micro-batches of 3, 3, 2; clipping to 0.1 active (norms are ~0.5);
    # a replayed row, an all-correct group, and a TIS weight on fresh tokens (sampler lp -4.5 vs ~-4.2).
    loss = LossConfig(norm=norm, entropy_coef=0.01, tis_cap=1.2)
    learner = _learner(model_path, loss=loss, minibatches=2, grad_clip=0.1, lr=1e-3)
    groups = _groups(0)
    metrics = learner.update(TrainBatch(groups=groups, version=7, clip=True)).metrics
    want, norms = _reference(model_path, groups, cfg=learner.cfg, loss=loss, clip=True)
    assert learner.version() == 8
    assert min(norms) > 0.1  # so both steps really were clipped
    assert metrics[M.GRAD_NORM] == pytest.approx(sum(norms) / 2, rel=1e-5)
    assert metrics[M.SKIPPED_STEPS] == 0
    assert metrics[M.LEARNER_TOKENS] == sum(len(t.response_ids) for g in groups for t in g.trajectories)
    # 1% of one Adam step (~lr): step 2's m/sqrt(v) amplifies float noise where g1 ~ -g2, so an exact
    # bound would flake; a wrong weighting or clip moves most elements by O(lr).
    _assert_weights_close(learner.get_weights(), want, atol=1e-5)


def test_update_moves_policy_toward_rewarded_responses(model_path):
    learner = _learner(model_path, lr=1e-2)
    groups = _groups(1, replay=False)
    before = AutoModelForCausalLM.from_pretrained(model_path).eval()
    for v in range(3):
        learner.update(TrainBatch(groups=groups, version=v, clip=False))
    after = AutoModelForCausalLM.from_pretrained(model_path).eval()
    after.load_state_dict(unpack_weights(learner.get_weights()))

    def advantage_weighted_logp(model) -> float:  # sum_i A_i * sum_t logp: what the update ascends
        total = 0.0
        with torch.no_grad():
            for g in groups:
                mean_r = sum(t.reward for t in g.trajectories) / len(g.trajectories)
                for t in g.trajectories:
                    total += (t.reward - mean_r) * float(
                        _row_stats(model, g.prompt_ids, t.response_ids)[0].sum()
                    )
        return total

    assert advantage_weighted_logp(after) > advantage_weighted_logp(before) + 0.1
    assert learner.version() == 3


def test_replayed_rows_use_stored_logprobs(model_path):
    learner = _learner(model_path, micro_batch_size=16)  # one micro-batch: every ratio is pre-step
    groups = _groups(2)
    replayed = groups[0].trajectories[0]
    model = AutoModelForCausalLM.from_pretrained(model_path).eval()
    with torch.no_grad():
        logp = _row_stats(model, groups[0].prompt_ids, replayed.response_ids)[0]
    # w* = exp(logp - stored), stored = -3.0 + 0.1 k while the model gives ~log(1/64) = -4.16: w* ~ 0.3
    expected = float(torch.exp(logp - torch.tensor(replayed.logprobs)).mean())
    metrics = learner.update(TrainBatch(groups=groups, version=0, clip=True)).metrics
    assert metrics[M.RATIO_REPLAY] == pytest.approx(expected, rel=1e-5)
    assert expected < 0.9
    assert metrics[M.RATIO_FRESH] == pytest.approx(1.0, abs=1e-6)  # proximal policy = current
    assert metrics[M.APPROX_KL] == pytest.approx(0.0, abs=1e-6)
    assert metrics[M.CLIP_FRAC] == 0.0
    fresh_only = learner.update(TrainBatch(groups=_groups(2, replay=False), version=1, clip=True)).metrics
    assert math.isnan(fresh_only[M.RATIO_REPLAY])


@pytest.mark.parametrize("case", ["above_threshold", "non_finite"])
def test_grad_norm_rule_skips_the_step(model_path, case):
    groups = _groups(3)
    if case == "above_threshold":
        learner = _learner(model_path, skip_grad_norm=1e-9)
    else:  # stored log-prob -1e4 and no shaping: w* = exp(~1e4) = inf, so the gradient is non-finite
        learner = _learner(model_path, loss=LossConfig(policy_shaping=False))
        t0 = groups[0].trajectories[0]
        bad = replace(t0, logprobs=(-1e4,) * len(t0.logprobs))
        groups = (replace(groups[0], trajectories=(bad, *groups[0].trajectories[1:])), *groups[1:])
    before, checksum = learner.get_weights(), learner.checksum()
    metrics = learner.update(TrainBatch(groups=groups, version=4, clip=True)).metrics
    assert metrics[M.SKIPPED_STEPS] == 1.0
    if case == "above_threshold":
        assert 0 < metrics[M.GRAD_NORM] < 10
    else:
        assert not math.isfinite(metrics[M.GRAD_NORM])
    assert learner.checksum() == checksum
    _assert_weights_close(learner.get_weights(), before, atol=0)
    assert learner.version() == 5
    assert learner.optimizer.state == {} or all(not s for s in learner.optimizer.state.values())  # no moments


@pytest.mark.parametrize("norm", ["constant", "token_mean"])
def test_micro_batching_is_exact(model_path, norm):
    loss = LossConfig(norm=norm, entropy_coef=0.01)
    groups = _groups(4)
    results = []
    for micro in (1, 16):
        learner = _learner(model_path, loss=loss, micro_batch_size=micro, lr=1e-4)
        metrics = learner.update(TrainBatch(groups=groups, version=0, clip=True)).metrics
        results.append((learner.get_weights(), metrics))
    (w1, m1), (w16, m16) = results
    # The grad norm checks the accumulated gradient's size; Adam's first step is ~lr * sign(g), so the
    # parameters check its direction (lr = 1e-4 keeps eps-regime noise, |g| ~ 1e-8, under 1e-6).
    assert m1[M.GRAD_NORM] == pytest.approx(m16[M.GRAD_NORM], rel=1e-6)
    assert m1[M.LOSS] == pytest.approx(m16[M.LOSS], rel=1e-6, abs=1e-9)
    _assert_weights_close(w1, w16, atol=1e-6)


@pytest.fixture(scope="module")
def fresh_learner(model_path) -> Learner:
    return _learner(model_path, micro_batch_size=2)


def test_entropies_match_direct_computation(fresh_learner, model_path):
    groups = _groups(5)
    cands = [
        ReplayCandidate(qid=g.qid, prompt_ids=g.prompt_ids, trajectory=t)
        for g in groups[:2]
        for t in g.trajectories[:3]
    ]
    model = AutoModelForCausalLM.from_pretrained(model_path).eval()
    with torch.no_grad():
        want = [float(_row_stats(model, c.prompt_ids, c.trajectory.response_ids)[1].mean()) for c in cands]
    got = fresh_learner.entropies(candidates=cands)
    np.testing.assert_allclose(got, want, rtol=1e-5)
    assert fresh_learner.entropies(candidates=[]) == []
    assert max(want) < math.log(64) + 1e-4  # entropy of a 64-way softmax is at most log 64


def _unresolved(seed: int, *, replays: tuple[int, ...] = (0,)) -> tuple[Group, ...]:
    """`_groups(seed)` with the replay groups in `replays` as the driver hands them over with
    `TrainBatch.select`: K - 1 fresh rollouts and three stored candidates of different lengths, slot 0 empty."""
    out = []
    for i, g in enumerate(_groups(seed, replay=False)):
        if i not in replays:
            out.append(g)
            continue
        cands = tuple(
            _traj(1000 * (seed + 1) + 10 * i + c, 2 + 2 * c, 1.0, replayed=False, logprob=-2.0 - c)
            for c in range(3)
        )
        out.append(replace(g, kind="replay", trajectories=g.trajectories[1:], candidates=cands))
    return tuple(out)


def test_select_update_scores_picks_and_trains_what_the_driver_would(model_path):
    groups = _unresolved(8, replays=(0, 3))
    a, b = _learner(model_path), _learner(model_path)
    got_u = a.update(TrainBatch(groups=groups, version=0, clip=True, select="lowest_entropy"))
    got_e, got = got_u.entropies, got_u.metrics
    want_e = b.entropies(candidates=replay_candidates(groups))
    filled = place_picks(groups, replay_picks(groups, want_e, mode="lowest_entropy"))
    want = b.update(TrainBatch(groups=filled, version=0, clip=True)).metrics
    np.testing.assert_allclose(got_e, want_e, rtol=1e-6)
    assert len(got_e) == 6 and len(set(got_e)) == 6  # six different scores: the picks are not tie-breaks
    # the picks: per replay group, the index of the candidate put in slot 0 (the lowest entropy)
    assert got_u.picks == (int(np.argmin(want_e[:3])), int(np.argmin(want_e[3:])))
    assert place_picks(groups, got_u.picks) == filled
    assert got[M.LOSS] == pytest.approx(want[M.LOSS], rel=1e-6) and got[M.LEARNER_SELECT_TIME] > 0
    assert a.version() == b.version() == 1
    _assert_weights_close(a.get_weights(), b.get_weights(), atol=0)


def test_random_select_is_seeded_and_scores_nothing(model_path):
    groups = tuple(replace(g, request_id=i) for i, g in enumerate(_unresolved(9, replays=(0, 1, 2, 3))))
    a, b = _learner(model_path), _learner(model_path)
    got = [x.update(TrainBatch(groups=groups, version=0, select="random", select_seed=7)) for x in (a, b)]
    assert got[0].picks == got[1].picks == replay_picks(groups, [], mode="random", seed=7)
    assert got[0].entropies == () and len(got[0].picks) == 4
    assert all(0 <= p < 3 for p in got[0].picks)
    _assert_weights_close(a.get_weights(), b.get_weights(), atol=0)
    # the seed draws: over seeds 0..19 the four picks are not always the same
    assert len({replay_picks(groups, [], mode="random", seed=s) for s in range(20)}) > 1
    with pytest.raises(ValueError, match="select='entropy'"):
        TrainBatch(groups=groups, version=1, select="entropy")  # type: ignore[arg-type]


def test_get_weights_is_the_hf_state_dict(fresh_learner, model_path):
    model = AutoModelForCausalLM.from_pretrained(model_path)
    sd = model.state_dict()
    packed = fresh_learner.get_weights()
    assert [(s.name, s.shape, s.dtype) for s in packed.layout] == [
        (k, tuple(v.shape), "float32") for k, v in sd.items()
    ]
    assert packed.buffer.dtype == np.uint8 and packed.buffer.ndim == 1  # one contiguous buffer
    assert packed.numel == fresh_learner.num_parameters() == sum(p.numel() for p in model.parameters())
    _assert_weights_close(packed, {k: v.numpy() for k, v in sd.items()}, atol=0)
    assert fresh_learner.checksum() == pytest.approx(
        sum(float(p.detach().double().sum()) for p in model.parameters())
    )


def test_save_and_load_restore_weights_moments_and_version(model_path, tmp_path):
    a = _learner(model_path)
    a.update(TrainBatch(groups=_groups(6), version=0, clip=True))
    a.save(path=str(tmp_path / "ckpt"))
    b = _learner(model_path)
    b.load(path=str(tmp_path / "ckpt"))
    assert (b.version(), b.checksum()) == (1, a.checksum())
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "ckpt")
    _assert_weights_close({k: v.numpy() for k, v in hf.state_dict().items()}, a.get_weights(), atol=0)
    for learner in (a, b):  # equal second steps need equal Adam moments
        learner.update(TrainBatch(groups=_groups(7), version=1, clip=True))
    _assert_weights_close(a.get_weights(), b.get_weights(), atol=0)


@pytest.mark.parametrize("zero_stage, chunk", [(3, 4096), (3, 2), (2, 2), (0, 2)])
def test_chunked_logits_under_zero_stages_equal_one_plain_rank(model_path, zero_stage, chunk):
    # The chunked log-probs run the model's forward (through the DeepSpeed engine) and lm_head a chunk at a
    # time. ZeRO-3 once took another gradient here: the forward skipped the engine, whose forward starts a
    # micro-batch for ZeRO-3 (without it each micro-batch's gradient overwrote the previous ones: grad norm
    # 0.230 instead of 0.615 on these batches). Three updates of 3 micro-batches each.
    loss = LossConfig(norm="token_mean", entropy_coef=0.01)
    kw = dict(loss=loss, lr=1e-3, micro_batch_size=3, grad_clip=0.1)
    want = _learner(model_path, **kw, zero_stage=0, logits_chunk_tokens=4096)
    got = _learner(model_path, **kw, zero_stage=zero_stage, logits_chunk_tokens=chunk)
    for step in range(3):
        groups = _groups(10 + step)
        a = got.update(TrainBatch(groups=groups, version=step, clip=True)).metrics
        b = want.update(TrainBatch(groups=groups, version=step, clip=True)).metrics
        assert a[M.GRAD_NORM] == pytest.approx(b[M.GRAD_NORM], rel=1e-5)
        assert a[M.LOSS] == pytest.approx(b[M.LOSS], rel=1e-5, abs=1e-7)
    _assert_weights_close(got.get_weights(), want.get_weights(), atol=1e-5)


@pytest.mark.integration
def test_only_a_ray_actor_borrows_idle_cores(ray_cluster):
    """A learner built in a driver that has Ray up (this test process) keeps its own thread count, so its
    results stay bit-reproducible; a learner actor reads the job's core ledger. (CI once saw two checkpoint
    round-trips differ in their last bits when the driver-side learners borrowed cores.)"""
    import ray

    from learners.modeling import ray_ledger

    @ray.remote(num_cpus=0)
    class Probe:
        def ledger(self):
            return ray_ledger()

    assert ray.is_initialized() and ray_ledger() is None
    probe = Probe.remote()
    try:
        assert ray.get(probe.ledger.remote()) is not None
    finally:
        ray.kill(probe)


@pytest.mark.integration
@pytest.mark.parametrize("zero_stage, chunk", [(2, 4096), (3, 2)], ids=["zero2-whole", "zero3-chunked"])
def test_two_learners_under_ray_match_one_learner(ray_cluster, model_path, zero_stage, chunk):
    import ray

    from exgrpo.runtime.env import remote_actor
    from learners.group import LearnerGroup

    # token-mean normaliser: the two ranks hold different token counts, so exactness needs the
    # all-reduced token total; the ZeRO optimiser sees only its half of the flat fp32 parameters, so the
    # grad norm needs the all-reduced squared sums. ZeRO-3 also gathers parameters for every forward and
    # for get_weights (collective on both ranks), and pads the forwards of a rank with fewer candidates.
    # ZeRO-2 with whole logits, ZeRO-3 with lm_head in chunks of 2 positions (the path that once diverged),
    # both against one plain rank with whole logits.
    cfg = LearnerConfig(
        num=2, zero_stage=zero_stage, lr=1e-3, micro_batch_size=3, grad_clip=0.1, logits_chunk_tokens=chunk
    )
    loss = LossConfig(norm="token_mean", entropy_coef=0.01)
    group = LearnerGroup(
        num=2,
        make_actor=remote_actor,
        model_path=model_path,
        learner_cfg=cfg,
        loss_cfg=loss,
        max_response_len=MAX_LEN,
    )
    single = _learner(model_path, loss=loss, lr=1e-3, micro_batch_size=3, grad_clip=0.1, zero_stage=0)
    try:
        for step in range(3):
            batch = TrainBatch(groups=_groups(10 + step), version=step, clip=True)
            got = group.update(batch=batch).metrics
            want = single.update(TrainBatch(groups=batch.groups, version=step, clip=True)).metrics
            assert got[M.GRAD_NORM] == pytest.approx(want[M.GRAD_NORM], rel=1e-5)
            assert got[M.LEARNER_TOKENS] == want[M.LEARNER_TOKENS]
        sums = group.checksums()
        assert sums[0] == sums[1]  # both ranks hold (or gather) the same full parameters
        assert sums[0] == pytest.approx(single.checksum(), rel=1e-6)
        # 1% of one Adam step (lr): float noise of the two-rank reduction is amplified only where g ~ 0.
        _assert_weights_close(ray.get(group.get_weights_ref()), single.get_weights(), atol=1e-5)
        cands = [
            ReplayCandidate(qid="c", prompt_ids=(1, 2), trajectory=t) for t in _groups(20)[1].trajectories
        ]
        for n in (3, 1):  # 2 + 1 and 1 + 0 candidates per rank
            np.testing.assert_allclose(
                group.entropies(candidates=cands[:n]), single.entropies(candidates=cands[:n]), rtol=1e-5
            )
        # scoring and picking inside the update: each rank its own slice; the scores come back in batch order
        groups = _unresolved(40, replays=(0, 1))  # both on rank 0: rank 1 scores nothing
        got_u = group.start_update(
            batch=TrainBatch(groups=groups, version=3, clip=True, select="lowest_entropy")
        ).result()
        want_u = single.update(TrainBatch(groups=groups, version=3, clip=True, select="lowest_entropy"))
        want_e, want_m = want_u.entropies, want_u.metrics
        np.testing.assert_allclose(got_u.entropies, want_e, rtol=1e-5)
        assert got_u.picks == want_u.picks and len(got_u.picks) == 2
        assert got_u.metrics[M.GRAD_NORM] == pytest.approx(want_m[M.GRAD_NORM], rel=1e-5)
        # random picks: each group draws from (seed, request id), so the split over ranks changes nothing
        groups = tuple(replace(g, request_id=i) for i, g in enumerate(_unresolved(41, replays=(0, 1, 2))))
        batch = TrainBatch(groups=groups, version=4, clip=True, select="random", select_seed=3)
        got_u, want_u = group.update(batch=batch), single.update(batch)
        assert got_u.picks == want_u.picks == replay_picks(groups, [], mode="random", seed=3)
        assert got_u.metrics[M.GRAD_NORM] == pytest.approx(want_u.metrics[M.GRAD_NORM], rel=1e-5)
        with pytest.raises(ValueError, match="multiple of learners.num=2"):
            group.update(batch=TrainBatch(groups=_groups(30, n=3), version=3))
    finally:
        group.shutdown()
