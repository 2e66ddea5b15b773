"""Admission (exgrpo/loop/scheduler.py, driven by exgrpo/loop/driver.py): requests are issued at most eta versions
ahead of the learners, and a sampler-count change applies at a step boundary.

The loop on in-process fakes (tests/exgrpo/loop/loop_harness.py): no Ray, no model, a few seconds.
"""

from __future__ import annotations

import pytest
from loop_harness import (
    build,
    check_batches,
    config,
    qnum,
    step_of_requests,
)

from exgrpo.core import metric_names as M


@pytest.mark.parametrize("eta", [0, 1, 2])
def test_admission_paces_requests_to_at_most_eta_versions_ahead(eta):
    # Rewards: question q has k_q = 1 + q % 2 correct fresh rollouts (a replay group: k_q of K - 1 plus
    # the slot, at most 3 < K), so nothing retires and nothing is replaced. Samplers use the weights of
    # the submit time (worst case) and hold every third request back for 2 polls.
    # Step t is admitted at the top of iteration max(0, t - eta), i.e. at version max(0, t - eta),
    # and trained at version t: staleness = min(t, eta) exactly, for every group of the step.
    cfg = config(f"async.max_staleness={eta}", "trainer.steps=7")
    driver, rollouts, learners, _ = build(
        cfg,
        lambda r, i, v: float(i < 1 + qnum(r) % 2),
        version_at="submit",
        hold=lambda r: 2 * (r.request_id % 3 == 0),
    )
    records = driver.train()
    check_batches(records, learners)
    assert driver.weights.broadcasts == list(range(1, 8))
    for t, (rec, batch) in enumerate(zip(records, learners.batches, strict=True)):
        assert rec[M.REPLACED] == 0
        for g in batch.groups:
            assert g.admitted_version == max(0, t - eta)
            assert batch.version - g.policy_version == min(t, eta)
        assert rec[M.STALENESS_MAX] == min(t, eta) <= eta
    # submissions as the samplers saw them: never more than eta steps ahead of the weights, and the
    # pipeline is actually eta deep (with eta = 0 every step waits for the previous update)
    owner = step_of_requests(learners)
    ahead = [owner[r.request_id] - s.version for s in rollouts.submissions for r in s.requests]
    assert max(ahead) == eta and min(ahead) >= 0
    assert len(rollouts.submissions) == 7  # one submit per step (no re-issues)


def test_a_scale_change_reaches_the_jobs_output_with_its_step(caplog):
    """`python -m exgrpo.scale`: before, the change was an INFO line that a job's output (a warning level, or
    the Python API without logging set up) did not show."""

    class Desired:
        def desired_samplers(self):
            return 3

    driver, rollouts, _, _ = build(config("trainer.steps=1"), lambda r, i, v: 0.0)
    driver.fleet.scaling = Desired()  # the operator's count, as `Roles.scaling` gives it
    with caplog.at_level("WARNING", logger="exgrpo.loop.driver"):
        driver.train()
    assert "step 0: scaling samplers 1 -> 3" in [r.getMessage() for r in caplog.records]
