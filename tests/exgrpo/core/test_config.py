"""Config loading: defaults, YAML + overrides, and every invalid case gives its message."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from exgrpo.core.config import Config, ConfigError, from_dict
from exgrpo.core.config_files import PACKAGED_CONFIGS, load_config, parse_override


def test_default_loads_and_round_trips():
    cfg = load_config()
    assert isinstance(cfg, Config)
    assert cfg.replay.rho == 0.5 and cfg.trainer.rollouts_per_question == 8
    again = from_dict(cfg.to_dict())
    assert again == cfg


def test_every_packaged_config_validates_and_plans():
    from exgrpo.runtime.resources import placement_plan

    names = sorted(PACKAGED_CONFIGS.glob("*.yaml"))
    assert {p.stem for p in names} >= {
        "default",
        "tiny-cpu",
        "qwen2.5-math-7b",
        "qwen2.5-math-1.5b",
        "llama3.1-8b",
    }
    for path in names:
        cfg = load_config(path)
        plan = placement_plan(cfg)
        assert (
            f"exgrpo-learner-{cfg.learners.num - 1}" in plan
            and f"exgrpo-sampler-{cfg.samplers.num - 1}" in plan
        )
        assert (
            path.read_text().startswith("#") and "python -m exgrpo.run" in path.read_text()
        )  # launch command


def test_yaml_file_and_overrides(tmp_path: Path):
    f = tmp_path / "c.yaml"
    f.write_text("replay:\n  rho: 0.25\ntrainer:\n  steps: 3\n")
    cfg = load_config(
        f, ["learners.lr=1e-4", "trainer.steps=7", "async.max_staleness=0", "learners.betas=[0.8, 0.9]"]
    )
    assert cfg.replay.rho == 0.25
    assert cfg.learners.lr == 1e-4  # YAML 1.1 alone would read "1e-4" as a string
    assert cfg.trainer.steps == 7
    assert cfg.async_.max_staleness == 0
    assert cfg.learners.betas == (0.8, 0.9)


def test_override_parsing():
    assert parse_override("replay.rho=0.25") == {"replay": {"rho": 0.25}}
    assert parse_override("model.path=/a=b") == {"model": {"path": "/a=b"}}
    with pytest.raises(ConfigError, match="section.key=value"):
        parse_override("replay.rho")
    with pytest.raises(ConfigError, match="must be section.key"):
        parse_override("rho=0.1")
    # YAML 1.1 reads a bare off/on as a boolean: a choice named off (or on) still takes it
    assert load_config(None, ["learners.autocast=off"]).learners.autocast == "off"
    assert load_config(None, ["learners.gradient_checkpointing=on"]).learners.gradient_checkpointing == "on"
    with pytest.raises(ConfigError, match="learners.autocast=True is not allowed"):
        load_config(None, ["learners.autocast=on"])


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["replay.rho=1.5"], r"replay.rho=1.5 must lie in \[0, 1\]"),
        (["replay.rho=-0.1"], r"replay.rho=-0.1 must lie in \[0, 1\]"),
        (["trainer.rollouts_per_question=1"], r"trainer.rollouts_per_question=1 must be >= 2 \(K: group"),
        (["learners.num=3", "trainer.questions_per_step=8"], "not divisible across learners.num=3"),
        (["learners.minibatches=3"], "mini-batches"),
        (["replay.rhoo=0.3"], "did you mean 'rho'"),
        (["replays.rho=0.3"], "did you mean 'replay'"),
        (["samplers.engine=tgi"], r"samplers.engine='tgi' is not allowed; choose one of \['hf', 'vllm'\]"),
        (["trainer.steps=abc"], "trainer.steps must be an integer"),
        (["trainer.steps=0"], "trainer.steps=0 must be >= 1"),
        (["loss.beta=0"], "loss.beta=0.0 must be > 0"),
        (["loss.clip_eps=1.5"], r"loss.clip_eps=1.5 must lie in \(0, 1\)"),
        (["async.weight_sync=collective"], "needs samplers.engine=vllm"),
        (
            ["async.weight_sync=collective", "samplers.engine=vllm", "learners.num_gpus=1"],
            "same kind of device",
        ),
        (["learners.zero_stage=5"], r"learners.zero_stage=5 must lie in \[0, 3\]"),
        (["async.max_staleness=-1"], r"async.max_staleness=-1 must be >= 0 \(0 = synchronous\)"),
        (["replay.mu=9"], r"replay.mu=9.0 must lie in \(0, trainer.rollouts_per_question=8\)"),
        (["samplers.num=0"], r"samplers.num=0 must be >= 1 \(scale down to 1, not 0\)"),
        (["logging.dashboard_port=0"], r"logging.dashboard_port=0 must lie in \[1, 65535\] \(a TCP port\)"),
        (
            ["data.fresh_per_step=9"],
            r"data.fresh_per_step=9 must lie in \[1, trainer.questions_per_step=8\] \(or null",
        ),
        (["samplers.top_p=0"], r"samplers.top_p=0.0 must lie in \(0, 1\]"),
        (["replay.enabled=maybe"], "replay.enabled must be true or false"),
    ],
)
def test_invalid_configs_name_field_and_fix(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, overrides)


def test_several_errors_are_reported_together():
    with pytest.raises(ConfigError) as err:
        load_config(None, ["replay.rho=2", "trainer.rollouts_per_question=1"])
    assert "replay.rho" in str(err.value) and "trainer.rollouts_per_question=1 must be >= 2" in str(err.value)


def test_missing_config_file_lists_packaged():
    with pytest.raises(ConfigError, match="packaged configs: .*default"):
        load_config("no-such-config.yaml")


def test_print_config_cli():
    out = subprocess.run(
        [sys.executable, "-m", "exgrpo.run", "--print-config", "replay.rho=0.25"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "rho: 0.25" in out.stdout and "async:" in out.stdout
    bad = subprocess.run(
        [sys.executable, "-m", "exgrpo.run", "--print-config", "replay.rho=3"], capture_output=True, text=True
    )
    assert bad.returncode == 2 and "replay.rho=3.0 must lie in [0, 1]" in bad.stderr


def test_dry_run_prints_plan():
    out = subprocess.run(
        [sys.executable, "-m", "exgrpo.run", "--dry-run", "samplers.num=3"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "exgrpo-sampler-2" in out.stdout and "exgrpo-learner-0" in out.stdout


def test_literal_types_are_defined_once():
    """Engine kind, template, dtype and reward mode: one Literal each, in exgrpo.core.config_sections."""
    import re
    from typing import get_args, get_type_hints

    from actors import sampling
    from exgrpo import evaluate
    from exgrpo.core import config
    from exgrpo.core.config import Dtype, EngineKind, ModelConfig, RewardMode, SamplerConfig, TemplateName
    from exgrpo.data import templates
    from exgrpo.models import smollm2, warmup
    from exgrpo.verify import verifier as rewards

    model, sampler = get_type_hints(ModelConfig), get_type_hints(SamplerConfig)
    assert (model["dtype"], model["template"], sampler["engine"]) == (Dtype, TemplateName, EngineKind)
    assert templates.TemplateName is TemplateName and templates.RewardMode is RewardMode
    assert get_args(TemplateName) == templates.TEMPLATES
    assert get_type_hints(rewards.extract_answer)["mode"] is RewardMode
    assert get_type_hints(smollm2.convert_smollm2)["dtype"] is Dtype
    assert get_type_hints(warmup.WarmupSpec)["template"] is TemplateName
    assert (sampling.TemplateName, evaluate.EngineKind, evaluate.Dtype) == (TemplateName, EngineKind, Dtype)
    # no module of the package spells one of these literals out again
    spelt = re.compile(r'Literal\[[^\]]*"(vllm|llama-base|bfloat16|think)"')
    package = Path(config.__file__).parent
    copies = [
        str(p.relative_to(package))
        for p in package.rglob("*.py")
        if p.name != "config_sections.py" and spelt.search(p.read_text())
    ]
    assert copies == []


def test_a_new_training_task_brings_its_own_held_out_set(tmp_path):
    from exgrpo.core.config_files import load_config

    assert load_config(None).data.eval == "builtin:scratchpad-heldout"  # the default task's own
    assert load_config("configs/tiny-cpu.yaml").data.eval == ""  # builtin:arith's held-out split
    assert load_config(None, ["data.train=builtin:gsm"]).data.eval == ""
    kept = ["data.train=builtin:gsm", "data.eval=builtin:arith"]
    assert load_config(None, kept).data.eval == "builtin:arith"
    user = tmp_path / "my.yaml"
    user.write_text("data:\n  train: builtin:gsm\n  eval: builtin:scratchpad-heldout\n")
    assert load_config(user, ["data.train=builtin:arith"]).data.eval == "builtin:scratchpad-heldout"


def test_a_typo_names_the_file_or_override_it_came_from(tmp_path):
    path = tmp_path / "my.yaml"
    path.write_text("trainer:\n  steps: 4\nreplay:\n  rhoo: 0.3\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert str(err.value) == f"config file {str(path)!r}: unknown config key replay.rhoo; did you mean 'rho'?"
    path.write_text("trainer:\n  steps: many\n")
    with pytest.raises(ConfigError, match=r"config file '.*my.yaml': trainer.steps must be an integer"):
        load_config(path)
    path.write_text("trainer:\n  steps: 4\n")
    with pytest.raises(ConfigError) as err:
        load_config(path, ["trainer.steps=5", "replay.rhoo=0.3"])
    assert str(err.value) == "override 'replay.rhoo=0.3': unknown config key replay.rhoo; did you mean 'rho'?"
    with pytest.raises(ConfigError, match=r"^override 'replays.rho=0.3': unknown config section 'replays'"):
        load_config(None, ["replays.rho=0.3"])


def test_samples_settings_default_on_and_refuse_negatives():
    lc = load_config(None, []).logging
    assert lc.samples_every > 0 and lc.samples_per_step > 0
    assert load_config(None, ["logging.samples_every=0"]).logging.samples_every == 0  # off
    for field in ("samples_every", "samples_per_step"):
        with pytest.raises(ConfigError, match=rf"logging.{field}=-1 must be >= 0"):
            load_config(None, [f"logging.{field}=-1"])


def test_lora_and_kl_are_off_by_default_and_checked_at_load_time():
    cfg = load_config(None)
    assert (cfg.learners.lora_rank, cfg.loss.kl_coef) == (0, 0.0)
    on = load_config(
        None, ["learners.lora_rank=8", "learners.lora_target_modules=q_proj,v_proj", "loss.kl_coef=0.01"]
    )
    assert on.learners.lora_target_modules == ("q_proj", "v_proj")
    assert load_config(None, ["learners.lora_rank=8"]).learners.lora_target_modules[-1] == "down_proj"
    for bad, says in [
        (
            ["learners.lora_rank=8", "learners.zero_stage=3"],
            "learners.lora_rank > 0 needs whole base weights",
        ),
        (["loss.kl_coef=0.1", "learners.zero_stage=3"], "loss.kl_coef > 0 keeps the reference policy"),
        (["learners.lora_rank=-1"], "learners.lora_rank=-1 must be >= 0"),
        (["learners.lora_rank=4", "learners.lora_alpha=0"], "learners.lora_alpha=0.0 must be > 0"),
        (["loss.kl_coef=-0.1"], "loss.kl_coef=-0.1 must be >= 0"),
    ]:
        with pytest.raises(ConfigError, match=re.escape(says)):
            load_config(None, bad)
    # the ZeRO-3 refusals name the stage only when the feature is on
    assert load_config(None, ["learners.zero_stage=3"]).learners.zero_stage == 3


def test_bfloat16_learners_need_a_zero_stage_with_float32_gradients():
    with pytest.raises(ConfigError, match=re.escape("use learners.zero_stage=1 or more")):
        load_config(None, ["model.dtype=bfloat16", "learners.zero_stage=0"])
    assert load_config(None, ["model.dtype=bfloat16", "learners.zero_stage=1"]).model.dtype == "bfloat16"
    assert load_config("qwen2.5-math-1.5b").learners.zero_stage == 2  # the bf16 recipes load


def test_a_packaged_config_finds_its_files_from_any_directory(tmp_path, monkeypatch):
    """`--config length-cpu` from outside the checkout: before, its reward and data paths were read from the
    working directory and the start failed ("no such file 'docs/examples/length/reward.py'")."""
    from exgrpo.core.config_files import PROJECT_ROOT
    from exgrpo.runtime.preflight import check_data, check_reward

    monkeypatch.chdir(tmp_path)
    cfg = load_config("length-cpu")
    assert cfg.reward.fn == f"{PROJECT_ROOT / 'docs/examples/length/reward.py'}:reward"
    assert cfg.data.train == str(PROJECT_ROOT / "docs/examples/length/train.jsonl")
    assert cfg.model.path == "builtin:tiny"  # names stay names
    assert "imports" in check_reward(cfg) and "train /" in check_data(cfg)
    mine = tmp_path / "mine.yaml"  # a user's own file keeps its paths as written (read from the cwd)
    mine.write_text("reward:\n  fn: docs/examples/length/reward.py:reward\n")
    assert load_config(mine).reward.fn == "docs/examples/length/reward.py:reward"
