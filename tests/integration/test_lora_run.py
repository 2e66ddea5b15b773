"""LoRA and the KL penalty in a real run: local Ray, HF samplers (and vLLM's weight-transfer API), DeepSpeed.

The warm-started tiny model of ``tests/conftest.py`` on single-digit sums, the wiring of ``test_runtime``.
The samplers must serve exactly the learner's merged weights (equal checksums), whichever transport.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_runtime import check_batches, run

from exgrpo.core import metric_names as M

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # ~150 s and ~100 s on 2 shared cores

LORA = ["learners.lora_rank=4", "learners.lora_alpha=8", "learners.lr=1e-3", "loss.kl_coef=0.01"]


@pytest.fixture(scope="module")
def model_path(warm_model):
    return warm_model


def _report(run_dir: Path, records) -> None:
    summary = json.loads((run_dir / "summary.json").read_text())
    before, after = summary["eval_accuracy_before"], summary["eval_accuracy_after"]
    kls = [r[M.KL] for r in records]
    print(f"held-out accuracy before {before:.3f} after {after:.3f}; learner/kl {[f'{k:.2e}' for k in kls]}")
    assert 0 <= before <= 1 and 0 <= after <= 1
    assert kls[0] == 0.0 and kls[-1] > 0  # the first update starts at the initial policy


def test_lora_with_kl_through_the_object_store(ray_cluster, tmp_path, model_path, single_digit_data):
    cfg, records, batches, learner_sums, sampler_sums, versions = run(
        tmp_path, model_path, single_digit_data, [*LORA, "trainer.steps=10", "async.max_staleness=0"]
    )
    assert [r[M.VERSION] for r in records] == list(range(1, 11))
    check_batches(cfg, batches, records)
    assert versions == [10, 10]
    assert sampler_sums == pytest.approx([learner_sums[0]] * 2, rel=1e-9)  # merged weights, all of them
    _report(tmp_path, records)


@pytest.mark.vllm
def test_lora_through_vllms_weight_transfer_api(ray_cluster, tmp_path, model_path, single_digit_data):
    cfg, records, batches, learner_sums, sampler_sums, versions = run(
        tmp_path,
        model_path,
        single_digit_data,
        [
            *LORA,
            "trainer.steps=3",
            "async.max_staleness=0",
            "samplers.engine=vllm",
            "samplers.num=1",
            "async.weight_sync=collective",
        ],
    )
    check_batches(cfg, batches, records)
    assert versions == [3]
    assert sampler_sums[0] == pytest.approx(learner_sums[0], rel=1e-5)
    _report(tmp_path, records)
