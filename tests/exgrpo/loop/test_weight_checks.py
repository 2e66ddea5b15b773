"""``exgrpo.loop.weight_checks``: each sampler's served sums and log-prob gap against the learner's, fail-closed
after ``checks.max_failures`` in a row; the per-layer sums that catch what a plain sum misses."""

from __future__ import annotations

import logging

import pytest
import torch

from exgrpo.core.config import ChecksConfig, from_dict
from exgrpo.core.records import Group, RolloutResult, TrainBatch, UpdateResult
from exgrpo.loop.weight_checks import WeightCheckFailed, WeightChecks, mismatch, why_off
from exgrpo.transport.checksums import grouped_sums, layer_of

SENT = (("layer 0", 1.5, 100.0), ("layer 1", -2.0, 100.0), ("rest", 3.0, 50.0))


def _served(delta: float = 0.0) -> tuple[tuple[str, float], ...]:
    return tuple((g, s + (delta if g == "layer 1" else 0.0)) for g, s, _ in SENT)


def _result(sampler: str, version: int, sums, rids=(0,)) -> RolloutResult:
    return RolloutResult(sampler, tuple(rids), version, 1, 0.0, 0.0, served_sums=sums)


def _batch(version: int, rids=()) -> TrainBatch:
    return TrainBatch(groups=tuple(Group(f"q{r}", (1,), (), request_id=r) for r in rids), version=version)


def _checks(**kw) -> WeightChecks:
    return WeightChecks(ChecksConfig(**kw), checksum=True, gap=True)


def test_layer_sums_see_a_swap_between_layers_that_a_plain_sum_misses():
    torch.manual_seed(0)
    a, b = torch.randn(8, 8), torch.randn(8, 8)
    state = {"model.layers.0.mlp.down_proj.weight": a, "model.layers.1.mlp.down_proj.weight": b}
    swapped = {"model.layers.0.mlp.down_proj.weight": b, "model.layers.1.mlp.down_proj.weight": a}
    sent = grouped_sums(state.items(), with_abs=True)
    served = {g: s for g, s, _ in grouped_sums(swapped.items())}
    assert sum(s for _, s, _ in sent) == pytest.approx(sum(served.values()), rel=1e-12)  # a plain sum: equal
    assert "layer 1 sums to" in (mismatch(sent, served, 1e-5)[0] or "")
    assert layer_of("model.layers.12.self_attn.qkv_proj.weight") == "layer 12"
    assert layer_of("model.embed_tokens.weight") == layer_of("lm_head.weight") == "rest"
    tied = {"model.embed_tokens.weight": a, "lm_head.weight": a}  # a tied head counts once
    assert grouped_sums(tied.items())[0][1] == pytest.approx(float(a.double().sum()))


def test_mismatch_within_tolerance_missing_layers_and_garbage():
    cause, worst = mismatch(SENT, dict(_served(0.0009)), 1e-5)  # 9e-6 of layer 1's sum of |w|
    assert cause is None and worst == pytest.approx(9e-6)
    assert "off by 1.1e-05" in (mismatch(SENT, dict(_served(0.0011)), 1e-5)[0] or "")
    assert "no layer 1" in (mismatch(SENT, {"layer 0": 1.5, "rest": 3.0}, 1e-5)[0] or "")
    assert "did not send" in (mismatch(SENT, {**dict(_served()), "layer 2": 0.0}, 1e-5)[0] or "")
    assert mismatch(SENT, dict(_served(float("nan"))), 1e-5)[0] is not None  # NaN weights fail


def test_a_sampler_whose_sums_stay_wrong_stops_the_run_naming_it_and_the_version(caplog):
    checks = _checks(max_failures=3)
    for v in (1, 2):
        checks.on_update(_batch(v - 1), UpdateResult({}, weight_sums=SENT))
        checks.on_result(_result("sampler-0", v, _served()))  # healthy
        checks.on_result(_result("sampler-1", v, _served(1.0)))  # wrong
        checks.on_result(_result("sampler-1", v, _served(1.0)))  # judged once per version
    assert checks.in_a_row[("checksum", "sampler-1")] == 2 and checks.in_a_row[("checksum", "sampler-0")] == 0
    # a result that arrives before the learner's sums waits for them
    checks.on_result(_result("sampler-1", 3, _served(1.0)))
    with pytest.raises(
        WeightCheckFailed, match=r"sampler-1 at version 3: layer 1 sums to .*3 versions in a row"
    ):
        checks.on_update(_batch(2), UpdateResult({}, weight_sums=SENT))
    assert checks.failures == 3 and checks.checked == 5 and checks.worst_match == 0.0


def test_a_pass_resets_the_count_and_max_failures_0_only_logs(caplog):
    checks = _checks(max_failures=2)
    for v, delta in [(1, 1.0), (2, 0.0), (3, 1.0)]:
        checks.on_update(_batch(v - 1), UpdateResult({}, weight_sums=SENT))
        checks.on_result(_result("sampler-0", v, _served(delta)))
    assert checks.in_a_row[("checksum", "sampler-0")] == 1
    quiet = _checks(max_failures=0)
    with caplog.at_level(logging.ERROR):
        for v in range(1, 6):
            quiet.on_update(_batch(v - 1), UpdateResult({}, weight_sums=SENT))
            quiet.on_result(_result("sampler-0", v, _served(1.0)))
    assert quiet.failures == 5 and "sampler-0 at version 5" in caplog.text


def test_the_gap_check_judges_each_sampler_on_its_own_tokens():
    checks = _checks(max_failures=2, logprob_min_tokens=10, logprob_max_share=0.05)
    for step in range(2):
        rids = (3 * step, 3 * step + 1, 3 * step + 2)
        checks.on_result(_result("sampler-0", step, (), rids=rids[:2]))
        checks.on_result(_result("sampler-1", step, (), rids=rids[2:]))
        gaps = ((rids[0], 40, 0.4, 0), (rids[1], 40, 0.4, 1), (rids[2], 20, 30.0, 15))  # sampler-1: 75% over
        if step == 0:
            checks.on_update(_batch(step, rids), UpdateResult({}, logprob_gaps=gaps))
            assert not set(rids) & set(checks.sampler_of)  # trained: forgotten
            continue
        with pytest.raises(
            WeightCheckFailed, match=r"log-prob gap\): sampler-1 at version 1: 75.0% of its 20"
        ):
            checks.on_update(_batch(step), UpdateResult({}, logprob_gaps=gaps))
    assert checks.in_a_row[("log-prob gap", "sampler-0")] == 0  # 1 of 80 tokens: 1.25%
    few = _checks(max_failures=1, logprob_min_tokens=30)
    few.on_result(_result("sampler-1", 0, (), rids=(7,)))
    few.on_update(_batch(0), UpdateResult({}, logprob_gaps=((7, 20, 30.0, 15),)))  # too few tokens to judge
    assert few.failures == 0


def test_checks_that_cannot_run_say_so_and_ask_nothing_of_the_learners(caplog):
    cfg = from_dict({"samplers": {"temperature": 0.7, "continuous": True, "engine": "vllm"}})
    lines = why_off(cfg)
    assert any("checks.logprob_gap is off" in x and "temperature=0.7" in x for x in lines)
    assert any("checks.checksum is off" in x and "continuous" in x for x in lines)
    with caplog.at_level(logging.WARNING):
        checks = WeightChecks.from_config(cfg)
    assert "checks.logprob_gap is off" in caplog.text
    assert checks.batch_options() == {"gap_bound": None, "weight_sums": False}
    on = WeightChecks.from_config(from_dict({}))
    assert on.batch_options() == {"gap_bound": ChecksConfig().logprob_bound, "weight_sums": True}
    with caplog.at_level(logging.WARNING):  # roles that report no sums: said once
        on.on_result(_result("sampler-0", 1, ()))
        on.on_result(_result("sampler-0", 2, ()))
    assert caplog.text.count("sampler-0 reports no served weight sums") == 1


def test_the_settings_are_checked_at_load_time():
    from exgrpo.core.config import ConfigError

    with pytest.raises(ConfigError, match="checks.checksum_tolerance"):
        from_dict({"checks": {"checksum_tolerance": 0}})
    with pytest.raises(ConfigError, match="checks.logprob_max_share"):
        from_dict({"checks": {"logprob_max_share": 2}})
    assert from_dict({"checks": {"max_failures": 0}}).checks.max_failures == 0
