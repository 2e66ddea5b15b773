"""The actor-learner runtime end to end on a real local Ray cluster, with real engines and DeepSpeed.

One warm-started tiny model (so rewards are neither all 0 nor all 1 and every replay path runs),
2 samplers, 2 replay shards and 1 DeepSpeed learner; the variants cover eta 0/1, both weight-sync
transports, sampler scaling during a run, the vLLM engine and the Ray metrics endpoint.
"""

from __future__ import annotations

import math
import subprocess
import sys
import time
import urllib.request

import pytest
import ray

from exgrpo.core import metric_names as M
from exgrpo.core.config_files import load_config
from exgrpo.loop.observer import Observer
from exgrpo.reporting.loggers import read_jsonl
from exgrpo.runtime.recipe import train

# fresh: the metrics endpoint must show this module's gauges, not those of an earlier module's runs
pytestmark = [pytest.mark.integration, pytest.mark.fresh_ray_cluster]

BASE = [
    "trainer.questions_per_step=4",
    "trainer.rollouts_per_question=4",
    "replay.start_solve_ratio=0.0",
    "replay.num_shards=2",
    "samplers.num=2",
    "samplers.requests_per_call=2",
    "learners.lr=1e-4",
    "learners.micro_batch_size=32",
    "model.max_response_len=12",
    "logging.progress=false",
    "logging.plots=false",
]


@pytest.fixture(scope="module")
def model_path(warm_model):
    return warm_model


class Watch(Observer):
    """Every TrainBatch and, after the last step, the learners' and samplers' checksums and versions;
    `self.system` for what a test does after a step (`on_step`)."""

    def __init__(self):
        self.system, self.batches = None, []

    def on_train_start(self, *, system, driver):
        self.system = system

    def on_batch(self, *, batch):
        self.batches.append(batch)

    def on_train_end(self, *, system, driver):
        system.samplers.wait_idle(timeout_s=120)
        system.samplers.wait_started(
            timeout_s=300
        )  # a replacement joins (with the weights of now) once it answers
        handles = list(system.samplers.members().values())
        self.learner_sums = system.learners.checksums()
        self.sampler_sums = ray.get([h.checksum.remote() for h in handles])
        self.sampler_versions = ray.get([h.version.remote() for h in handles])


def run(tmp_path, model_path, data, overrides, *, watch=None):
    """One run through the project's single wiring (`exgrpo.runtime.recipe.train`)."""
    cfg = load_config(
        None,
        [
            *BASE,
            f"data.train={data['train']}",
            f"data.eval={data['eval']}",
            f"model.path={model_path}",
            f"logging.run_dir={tmp_path}",
            *overrides,
        ],
    )
    watch = watch or Watch()
    result = train(cfg, checkpoints=False, observer=watch, stall_timeout_s=300)
    w = watch
    return cfg, result.records, w.batches, w.learner_sums, w.sampler_sums, w.sampler_versions


def check_batches(cfg, batches, records):
    K, B, eta = cfg.trainer.rollouts_per_question, cfg.trainer.questions_per_step, cfg.async_.max_staleness
    for batch, record in zip(batches, records, strict=True):
        assert len(batch.groups) == B
        n_replay = sum(g.kind == "replay" for g in batch.groups)
        # replay requests whose question retired in flight were re-issued as fresh ones (replay/replaced)
        assert n_replay == record[M.N_REPLAY]
        assert n_replay + record[M.REPLACED] == min(
            math.floor(cfg.replay.rho * B), record[M.REPLAY_AVAILABLE]
        )
        for g in batch.groups:
            if g.kind == "replay":
                assert len(g.trajectories) == K
                assert g.trajectories[0].replayed and g.trajectories[0].correct
                assert not any(t.replayed for t in g.trajectories[1:])
                assert g.trajectories[0].group_id != g.group_id  # never its own rollout
            else:
                assert not any(t.replayed for t in g.trajectories)
            for t in g.trajectories:
                if not t.replayed:
                    assert 0 <= batch.version - t.policy_version <= eta
        assert record[M.STALENESS_MAX] <= eta


def test_hf_eta1_object_store_with_scaling(ray_cluster, tmp_path, model_path, single_digit_data):
    class Scale(Watch):
        def on_step(self, *, record):
            if record[M.STEP] == 0:  # the operator's command, as a user runs it against the job's cluster
                address = ray.get_runtime_context().gcs_address
                out = subprocess.run(
                    [sys.executable, "-m", "exgrpo.scale", "--samplers", "3", "--address", address],
                    capture_output=True,
                    text=True,
                    timeout=120,
                )
                assert out.returncode == 0 and "3 samplers" in out.stdout, out.stderr[-2000:]
            if (
                record[M.STEP] == 1
            ):  # with async.overlap_update, step t's record comes once update t + 1 started
                ray.get(self.system.controller.set_samplers.remote(n=1))

    cfg, records, batches, learner_sums, sampler_sums, versions = run(
        tmp_path, model_path, single_digit_data, ["trainer.steps=5", "async.max_staleness=1"], watch=Scale()
    )
    assert [r[M.VERSION] for r in records] == [1, 2, 3, 4, 5]
    check_batches(cfg, batches, records)
    assert sum(r[M.N_REPLAY] for r in records) > 0, "replay never scheduled"
    assert any(r[M.MEAN_REWARD] > 0 for r in records)
    # scaling: grew to 3, then drained to 1
    assert max(r[M.SAMPLERS] for r in records) == 3 and records[-1][M.SAMPLERS] == 1
    # weight sync: every remaining sampler serves the learner's final weights
    assert len(sampler_sums) == 1 and versions == [5]
    assert sampler_sums[0] == pytest.approx(learner_sums[0], rel=1e-6)
    # the JSONL log is complete: every documented key in every record
    before, *logged = read_jsonl(tmp_path / "metrics.jsonl")
    assert before[M.STEP] == -1 and before[M.EVAL_VERSION] == 0  # the evaluation before the first step
    assert len(logged) == 5
    documented = {
        v for k, v in vars(M).items() if k.isupper() and isinstance(v, str) and "/" in v and "{" not in v
    }
    for rec in logged:
        missing = documented - set(rec) - M.OPTIONAL_KEYS
        assert not missing, missing
    assert M.EVAL_ACCURACY in logged[-1]
    # the Ray metrics endpoint exports the exgrpo_ gauges
    deadline, text = time.monotonic() + 60, ""
    while time.monotonic() < deadline and "exgrpo_rollout_mean_reward" not in text:
        time.sleep(0.5)
        text = (
            urllib.request.urlopen(f"http://127.0.0.1:{ray_cluster['metrics_port']}/metrics", timeout=5)
            .read()
            .decode()
        )
    assert "exgrpo_rollout_mean_reward" in text and "exgrpo_system_policy_version" in text


@pytest.mark.vllm
def test_vllm_eta0_through_the_weight_transfer_api(ray_cluster, tmp_path, model_path, single_digit_data):
    cfg, records, batches, learner_sums, sampler_sums, versions = run(
        tmp_path,
        model_path,
        single_digit_data,
        [
            "trainer.steps=3",
            "async.max_staleness=0",
            "samplers.engine=vllm",
            "samplers.num=1",
            "async.weight_sync=collective",
            "samplers.engine_process=child",  # the layout GPUs use: vLLM's engine core in its own process
        ],
    )
    check_batches(cfg, batches, records)
    assert all(r[M.STALENESS_MAX] == 0 for r in records)
    assert versions == [3]
    assert sampler_sums[0] == pytest.approx(learner_sums[0], rel=1e-5)


@pytest.mark.slow  # 89 s in CI; the child engine's loads (test_engine_process) and a vLLM run in that layout (above) stay in CI
@pytest.mark.vllm
def test_vllm_engine(ray_cluster, tmp_path, model_path, single_digit_data):
    cfg, records, batches, learner_sums, sampler_sums, versions = run(
        tmp_path,
        model_path,
        single_digit_data,
        # the layout GPUs use (the engine core in its own process): the default object-store weights reach it
        ["trainer.steps=3", "samplers.engine=vllm", "samplers.num=1", "samplers.engine_process=child"],
    )
    check_batches(cfg, batches, records)
    assert versions == [3]
    assert sampler_sums[0] == pytest.approx(learner_sums[0], rel=1e-5)
    assert any(r[M.MEAN_REWARD] > 0 for r in records)


def test_dead_sampler_is_replaced_and_loses_no_request(ray_cluster, tmp_path, model_path, single_digit_data):
    class KillSampler(Watch):
        def on_step(self, *, record):
            if record[M.STEP] == 0:  # kill a sampler while the next steps' requests are in flight
                ray.kill(next(iter(self.system.samplers.members().values())), no_restart=True)

    cfg, records, batches, learner_sums, sampler_sums, versions = run(
        tmp_path,
        model_path,
        single_digit_data,
        ["trainer.steps=4", "async.max_staleness=1"],
        watch=KillSampler(),
    )
    assert [r[M.VERSION] for r in records] == [1, 2, 3, 4]  # every step got its full batch
    check_batches(cfg, batches, records)
    assert records[-1][M.SAMPLER_RESTARTS] >= 1 and records[-1][M.SAMPLERS] == 2
    assert versions == [4, 4]


def test_a_start_that_fails_leaves_no_actor_behind(ray_cluster, tmp_path, model_path, monkeypatch):
    """The learners set up while the samplers start (`build_system`); when the samplers' start fails, the
    error reaches the caller and the learners and shards already started are stopped."""
    from exgrpo.runtime import assembly

    def no_samplers(*args, **kwargs):
        raise RuntimeError("sampler exgrpo-sampler-0 failed to start: boom")

    monkeypatch.setattr(assembly, "make_samplers", no_samplers)
    cfg = load_config(None, [*BASE, f"model.path={model_path}", f"logging.run_dir={tmp_path}"])
    with pytest.raises(RuntimeError, match="failed to start: boom"):
        assembly.build_system(cfg, model_path=model_path, run_dir=tmp_path)
    deadline = time.monotonic() + 30
    while ray.util.list_named_actors() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert ray.util.list_named_actors() == []
