"""Logger backends (exgrpo/reporting/loggers.py behind exgrpo.reporting.loggers.MetricsLogger): the same metric names in
metrics.jsonl, TensorBoard event files (read back) and an offline W&B run (its directory and its
.wandb log read back); config and run id recorded by each; a resume keeps the run id."""

from __future__ import annotations

import json
import time

import pytest

from exgrpo.core import metric_names as M
from exgrpo.core.config import ConfigError
from exgrpo.core.config_files import load_config
from exgrpo.reporting.loggers import MetricsLogger, read_jsonl


def records(n: int = 3) -> list[dict]:
    out = []
    for step in range(n):
        out.append(
            {
                M.STEP: step,
                M.MEAN_REWARD: 0.1 * step,
                M.SOLVE_RATIO: 0.2 + 0.1 * step,
                M.REPLAY_BUCKET.format(k=1): step,
                M.RETIRED: 2 * step,
                M.STALENESS_MEAN: 0.5,
                M.SYNC_TIME: 0.01 * (step + 1),
                M.REPLAY_STARTED: True,
                "eval/version": step + 1,
                M.LOSS: float("nan"),
            }
        )
    return out


def numeric_keys(record: dict) -> set[str]:
    return {
        k
        for k, v in record.items()
        if k != M.STEP and not isinstance(v, bool) and isinstance(v, int | float) and v == v
    }


def test_config_backends_parse_and_validate():
    assert load_config().logging.backends == ("jsonl",)
    cfg = load_config(None, ["logging.backends=[tensorboard,wandb]"])
    assert cfg.logging.backends == ("jsonl", "tensorboard", "wandb")  # jsonl is always on
    assert load_config(None, ["logging.backends=wandb"]).logging.backends == ("jsonl", "wandb")
    assert "backends:\n  - jsonl\n  - tensorboard\n  - wandb" in cfg.to_yaml()  # round-trips as a YAML list
    with pytest.raises(ConfigError, match="unknown backend"):
        load_config(None, ["logging.backends=[tensorbord]"])


def test_jsonl_only_and_run_id_kept_on_resume(tmp_path):
    logger = MetricsLogger(tmp_path, ray_metrics=False, config={"trainer": {"steps": 3}})
    run_id = logger.run_id
    for r in records(2):
        logger.log(r)
    logger.close()
    lines = read_jsonl(tmp_path / "metrics.jsonl")
    assert [r[M.STEP] for r in lines] == [0, 1] and lines[0][M.LOSS] is None  # NaN -> null
    info = json.loads((tmp_path / "run.json").read_text())
    assert info["run_id"] == run_id and info["config"] == {"trainer": {"steps": 3}}
    again = MetricsLogger(tmp_path, ray_metrics=False)
    assert again.run_id == run_id
    again.close()


def test_tensorboard_and_offline_wandb_share_names(tmp_path, monkeypatch):
    pytest.importorskip("tensorboard", reason="pip install -e '.[logging]' (scripts/setup.sh installs it)")
    pytest.importorskip("wandb", reason="pip install -e '.[logging]' (scripts/setup.sh installs it)")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("WANDB_API_KEY", "")  # offline needs no account
    cfg = load_config(None, ["logging.backends=[tensorboard,wandb]", "trainer.steps=3"])
    logger = MetricsLogger.from_config(tmp_path, cfg)
    recs = records(3)
    for r in recs:
        logger.log(r)
    logger.summary({"steps": 3, "wall_s": 1.5})
    wandb_dir = logger.backends["wandb"].dir
    logger.close()
    expected = numeric_keys(recs[0])

    # TensorBoard: every numeric metric is a scalar tag of the same name, one event per step
    acc = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert expected <= tags, expected - tags
    assert [e.step for e in acc.Scalars(M.MEAN_REWARD)] == [0, 1, 2]
    assert [round(e.value, 4) for e in acc.Scalars(M.SYNC_TIME)] == [0.01, 0.02, 0.03]
    text = {t: acc.Tensors(t)[0].tensor_proto.string_val[0].decode() for t in acc.Tags()["tensors"]}
    assert text["run_id/text_summary"] == logger.run_id
    assert "rollouts_per_question" in text["config/text_summary"]

    # W&B offline: <run_dir>/wandb/offline-run-*-<run id>/ with the config and the history in run-<id>.wandb
    run_dirs = list((tmp_path / "wandb").glob(f"offline-run-*-{logger.run_id}"))
    assert len(run_dirs) == 1 and wandb_dir.parent == run_dirs[0]
    history, summary, config = wandb_records(run_dirs[0] / f"run-{logger.run_id}.wandb")
    assert "trainer" in config, (sorted(config), wandb_kinds(run_dirs[0] / f"run-{logger.run_id}.wandb"))
    assert config["trainer"]["rollouts_per_question"] == cfg.trainer.rollouts_per_question
    assert config["logging"]["backends"] == ["jsonl", "tensorboard", "wandb"]
    assert [h[M.STEP] for h in history] == [0, 1, 2]
    assert expected <= set(history[0]), expected - set(history[0])
    assert history[2][M.MEAN_REWARD] == pytest.approx(0.2)
    assert summary.get("final/wall_s") == 1.5


def wandb_log_records(path) -> list[bytes]:
    """The payloads of a .wandb file: a 7-byte header (":W&B", magic, version), then 32 KiB blocks of
    records with a 7-byte header each (crc32, length, type: 1 full, 2 first, 3 middle, 4 last)."""
    import struct

    raw, block = path.read_bytes(), 32768
    assert raw[:4] == b":W&B", raw[:8]
    pos, out, parts = 7, [], b""
    while pos + 7 <= len(raw):
        if block - pos % block < 7:  # block trailer padding
            pos += block - pos % block
            continue
        _crc, length, kind = struct.unpack("<IHB", raw[pos : pos + 7])
        if kind == 0 and length == 0:
            break
        data, pos = raw[pos + 7 : pos + 7 + length], pos + 7 + length
        parts = data if kind in (1, 2) else parts + data
        if kind in (1, 4):
            out.append(parts)
    return out


def wandb_records(path) -> tuple[list[dict], dict, dict]:
    """History rows, summary and config of an offline .wandb file (its records are W&B's protobufs). Under a
    load of ~24 on 2 cores (CI, 2026-12-07) the file held no record right after finish(): W&B's service may
    still be writing it, so an empty file is read again for up to 30 s."""
    from wandb.proto import wandb_internal_pb2

    deadline = time.monotonic() + 30.0
    while not (records := wandb_log_records(path)) and time.monotonic() < deadline:
        time.sleep(0.5)
    history, summary, config = [], {}, {}
    for data in records:
        rec = wandb_internal_pb2.Record()
        rec.ParseFromString(data)
        kind = rec.WhichOneof("record_type")
        if kind == "history":
            history.append(
                {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in rec.history.item}
            )
        elif kind == "summary":
            summary.update(
                {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in rec.summary.update}
            )
        elif kind in ("run", "config"):
            items = rec.run.config.update if kind == "run" else rec.config.update
            for i in items:  # a top-level key, or a path of keys (a nested update)
                *path, last = [i.key] if i.key else list(i.nested_key)
                node = config
                for k in path:
                    node = node.setdefault(k, {})
                node[last] = json.loads(i.value_json)
    return history, summary, {k: v.get("value", v) if isinstance(v, dict) else v for k, v in config.items()}


def wandb_kinds(path) -> list[str]:
    """The record kinds of an offline .wandb file, in order (what a failed assertion shows)."""
    from wandb.proto import wandb_internal_pb2

    kinds = []
    for data in wandb_log_records(path):
        rec = wandb_internal_pb2.Record()
        rec.ParseFromString(data)
        kinds.append(str(rec.WhichOneof("record_type")))
    return kinds


def test_actor_env_quiet_by_default_and_verbose_restores(monkeypatch):
    """init_ray passes QUIET_ENV to every actor unless logging.verbose (no progress bars, no info noise)."""
    from exgrpo.runtime import env as launch

    seen = {}

    class Ctx:
        dashboard_url = "127.0.0.1:8265"

    def fake_init(**kwargs):
        seen.update(kwargs)
        return Ctx()

    monkeypatch.setattr(launch.ray, "is_initialized", lambda: False)
    monkeypatch.setattr(launch.ray, "init", fake_init)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    launch.init_ray(load_config(None, []))
    env = seen["runtime_env"]["env_vars"]
    assert env["HF_HUB_DISABLE_PROGRESS_BARS"] == "1" and env["TQDM_DISABLE"] == "1"
    assert seen["include_dashboard"] is False
    info = launch.init_ray(load_config(None, ["logging.verbose=true", "logging.dashboard=true"]))
    env = seen["runtime_env"]["env_vars"]
    assert not set(launch.QUIET_ENV) & set(env) and env["OMP_NUM_THREADS"] == "1"
    assert seen["include_dashboard"] is True and seen["dashboard_host"] == "127.0.0.1"
    assert info["dashboard_url"] == "http://127.0.0.1:8265"


def test_attached_job_keeps_its_own_runtime_env_vars(monkeypatch):
    """Under `ray job submit --runtime-env` with env_vars, init_ray leaves those keys to the job (Ray
    refuses a driver runtime env that sets the same keys again)."""
    from exgrpo.runtime import env as launch

    seen = {}
    monkeypatch.setattr(launch.ray, "is_initialized", lambda: False)
    monkeypatch.setattr(launch.ray, "init", lambda **kw: seen.update(kw))
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:6379")
    monkeypatch.setenv(
        "RAY_JOB_CONFIG_JSON_ENV_VAR",
        json.dumps({"runtime_env": {"env_vars": {"OMP_NUM_THREADS": "2"}, "working_dir": "x"}}),
    )
    launch.init_ray(load_config(None, []))
    env = seen["runtime_env"]["env_vars"]
    assert "OMP_NUM_THREADS" not in env and env["TQDM_DISABLE"] == "1"


def test_sampled_completions_reach_tensorboard_text_and_a_wandb_table(tmp_path, monkeypatch):
    pytest.importorskip("tensorboard", reason="pip install -e '.[logging]' (scripts/setup.sh installs it)")
    pytest.importorskip("wandb", reason="pip install -e '.[logging]' (scripts/setup.sh installs it)")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from exgrpo.reporting.samples import FIELDS

    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("WANDB_API_KEY", "")
    cfg = load_config(None, ["logging.backends=[tensorboard,wandb]"])
    logger = MetricsLogger.from_config(tmp_path, cfg)
    row = {"step": 2, "qid": "q7", "prompt": "What is 3+4?", "completion": "so \\boxed{7}", "reward": 1.0,
           "bucket": "3/4", "origin": "replayed", "policy_version": 1}  # fmt: skip
    logger.log({M.STEP: 2, M.MEAN_REWARD: 0.5})
    logger.log_samples([row, {**row, "origin": "fresh", "completion": "no idea", "reward": 0.0}], 2)
    logger.close()

    acc = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"tensors": 0})
    acc.Reload()
    (event,) = acc.Tensors("samples/text_summary")
    text = event.tensor_proto.string_val[0].decode()
    assert event.step == 2 and "**replayed** qid `q7`" in text and "    so \\boxed{7}" in text
    assert "**fresh**" in text and "    no idea" in text

    (run_dir,) = (tmp_path / "wandb").glob(f"offline-run-*-{logger.run_id}")
    # twice in CI under a load of ~24 on 2 cores (2026-12-07) the file held no record at all right after
    # finish(): W&B's service may still be writing it, so read again for up to 30 s before judging it
    deadline = time.monotonic() + 30.0
    while True:
        history, _, _ = wandb_records(run_dir / f"run-{logger.run_id}.wandb")
        samples = [h for h in history if "samples/_type" in h]
        if samples or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert len(samples) == 1, (
        wandb_kinds(run_dir / f"run-{logger.run_id}.wandb"),
        [sorted(h) for h in history],
    )
    (logged,) = samples
    assert logged[M.STEP] == 2 and logged["samples/_type"] == "table-file" and logged["samples/nrows"] == 2
    table = json.loads((run_dir / "files" / logged["samples/path"]).read_text())
    assert table["columns"] == list(FIELDS)
    assert [r[FIELDS.index("completion")] for r in table["data"]] == ["so \\boxed{7}", "no idea"]


def test_candidate_log_drops_the_rows_of_steps_trained_again(tmp_path):
    """A resumed or recovered run restarts at its checkpoint's step: the rows of later steps go, so none
    appears twice; a torn last line goes too."""
    from types import SimpleNamespace

    from exgrpo.reporting.loggers import CandidateLog

    log = CandidateLog(tmp_path / "candidates.jsonl")
    log.on_train_start(system=None, driver=SimpleNamespace(step=0))  # no file yet: nothing to do
    for step in range(4):
        log.on_candidates(step=step, rows=[{"step": step, "candidate": 0}, {"step": step, "candidate": 1}])
    with log.path.open("a") as f:
        f.write('{"step": 4, "cand')  # a write cut by the death
    log.on_train_start(system=None, driver=SimpleNamespace(step=2))
    assert [json.loads(line)["step"] for line in log.path.read_text().splitlines()] == [0, 0, 1, 1]
