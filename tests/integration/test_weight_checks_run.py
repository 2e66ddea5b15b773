"""The weight checks in real runs (local Ray, HF samplers, a DeepSpeed learner; the wiring of ``test_runtime``): a
healthy run never trips them, and a sampler whose loads silently do nothing or load a tensor into the wrong layer
(``actors/load_faults.py``) stops the run at the ``checks.max_failures``-th version it sampled with, naming it and
the version."""

from __future__ import annotations

import re

import pytest
from test_runtime import Watch, run

from exgrpo.core import metric_names as M
from exgrpo.core.faults import LOAD_FAULT_VAR
from exgrpo.loop.weight_checks import WeightCheckFailed
from exgrpo.reporting.loggers import read_jsonl

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def model_path(warm_model):
    return warm_model


class Checks(Watch):
    """`Watch`, and the driver's weight checks at the end."""

    def on_train_end(self, *, system, driver):
        super().on_train_end(system=system, driver=driver)
        self.checks = driver.weight_checks


def test_a_healthy_run_never_trips_the_checks(ray_cluster, tmp_path, model_path, single_digit_data):
    watch = Checks()
    _, records, *_ = run(
        tmp_path, model_path, single_digit_data, ["trainer.steps=3", "checks.max_failures=1"], watch=watch
    )
    checks = watch.checks
    tokens = [r[M.LOGPROB_GAP_TOKENS] for r in records]
    gaps = [r[M.LOGPROB_GAP_MEAN] for r in records if r[M.LOGPROB_GAP_TOKENS]]
    print(f"checked {checks.checked} (sampler, version) pairs, worst match {checks.worst_match:.2g}; "
          f"gap tokens {tokens}, mean |gap| {[f'{g:.2g}' for g in gaps]}, "
          f"p99 {[f'{r[M.LOGPROB_GAP_P99]:.2g}' for r in records if r[M.LOGPROB_GAP_TOKENS]]}")  # fmt: skip
    # at least one (sampler, version) pair after version 0 was compared: which versions the samplers sample at
    # depends on timing (eta = 1), so not every one is
    assert checks.failures == 0 and checks.checked >= 1
    assert sum(tokens) > 0 and max(gaps) < 1e-4  # float32 HF sampler vs float32 learner: the same numbers
    assert all(r[M.LOGPROB_GAP_OVER] == 0 for r in records if r[M.LOGPROB_GAP_TOKENS])


@pytest.mark.parametrize("kind", ["noop", pytest.param("swap", marks=pytest.mark.slow)])  # ~20 s each
def test_a_bad_load_stops_the_run_naming_the_sampler_and_the_version(
    kind, ray_cluster, tmp_path, model_path, single_digit_data, monkeypatch
):
    monkeypatch.setenv(LOAD_FAULT_VAR, f"sampler-1:{kind}@1")  # every load of sampler 1 from version 1 on
    with pytest.raises(WeightCheckFailed) as err:
        run(tmp_path, model_path, single_digit_data, ["trainer.steps=8", "checks.max_failures=2"])
    text = str(err.value)
    print(text)
    found = re.search(r"\((checksum|log-prob gap)\): (exgrpo-)?sampler-1 at version (\d+)", text)
    assert found is not None and "2 versions in a row" in text, text  # the second version it sampled with
    steps = [r for r in read_jsonl(tmp_path / "metrics.jsonl") if r[M.STEP] >= 0]
    print(f"stopped at version {found.group(3)} after {len(steps)} of 8 steps")
    assert len(steps) < 8 and int(found.group(3)) <= len(steps) + 1
