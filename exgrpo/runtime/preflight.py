"""The checks a start makes before Ray, made without starting anything (`python -m exgrpo.run --dry-run`).

`preflight(cfg)` checks, in the order a start meets them: the reward (`reward.fn` imports and takes
`(prompt, completion, fields)`), the model (a known builtin, or an HF model directory with config.json,
weights and a tokenizer), LoRA's target modules against the model's module names (built from its
config.json on the meta device: no weights are read), and the data (every file exists and reads into
prompts under `data.on_bad_row`, as the start reads them; every prompt fits `model.max_prompt_len` under
`data.long_prompts`, `exgrpo.data.lengths`). It returns one line per check, or raises the
error a start would raise (`ConfigError`, `DataError`, `ModelResolveError`), so `--dry-run` passes exactly
what a start passes, up to the cluster (`exgrpo.runtime.clusters.dry_run_fit` checks that).

`check_start(cfg, model_path=, run_dir=)` is the start's own checks once the model is built, right before
its actors (`exgrpo.runtime.assembly.build_system`): the context against the model's positions, the
cluster against the plan, the GPU memory plan; it returns the model directory the roles load.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from exgrpo.core.config import Config, ConfigError, builtin_name

if TYPE_CHECKING:
    from exgrpo.core.records import Prompt

log = logging.getLogger(__name__)


def preflight(cfg: Config, *, resume: bool = False) -> list[str]:
    """The checks of a start before Ray (module docstring); one line per check passed, else the start's error.
    `resume`: the model is the checkpoint's (`exgrpo.loop.checkpoint.resume_report` checks it), not `model.path`."""
    from exgrpo.data.readers import DataError
    from exgrpo.models.resolve import ModelResolveError

    lines: list[str] = []
    errors: list[Exception] = []
    path: Path | None = None

    def checked(check: Callable[[], list[str]]) -> bool:
        try:
            lines.extend(check())
        except (ConfigError, DataError, ModelResolveError) as err:  # every check runs: all errors at once
            errors.append(err)
            return False
        return True

    checked(lambda: [check_reward(cfg)])
    if resume:
        lines.append("model: the latest checkpoint's (checked with the resume)")
    elif checked(lambda: check_model(cfg)):
        path = model_dir(cfg)
    checked(lambda: [check_data(cfg, model_path=path)])
    if len(errors) == 1:
        raise errors[0]  # the start's own error, as it is
    if errors:
        raise ConfigError(
            f"{len(errors)} pre-flight checks failed:\n  - " + "\n  - ".join(str(e) for e in errors)
        )
    from exgrpo.runtime.elastic import dry_run_line

    return [line for line in (*lines, untested(cfg), dry_run_line(cfg)) if line]


def untested(cfg: Config) -> str:
    """A warning for the settings a start accepts although no GPU run has shown them ("" when none): tensor-
    parallel GPU samplers, accepted only with `samplers.allow_untested_tp` (exgrpo/core/config_checks.py)."""
    s = cfg.samplers
    if s.tensor_parallel_size > 1 and s.num_gpus > 0:
        return (
            f"warning: samplers.tensor_parallel_size={s.tensor_parallel_size} on GPUs is untested (no tensor-parallel "
            "sampler has run on a GPU yet); accepted because samplers.allow_untested_tp=true"
        )
    return ""


def check_start(cfg: Config, *, model_path: str, run_dir: str | Path | None = None) -> str:
    """The checks right before a start's actors; returns the model directory the roles load (with the
    position override of `model.*`, written under `run_dir`, else under the model cache). Raises
    `ConfigError` (or the cluster check's error) now rather than in a placement group that waits forever."""
    from exgrpo.core.positions import check_context, positioned_model
    from exgrpo.runtime.memory_plan import dry_run_report
    from exgrpo.runtime.resources import check_cluster

    check_context(cfg.model, model_path)  # prompt + response must fit the model's positions (or the override)
    # the position override lives in the config.json of the directory both learners and samplers load
    model_path = positioned_model(
        cfg.model,
        model_path,
        out_root=Path(run_dir) if run_dir is not None else Path(cfg.model.cache_dir) / "models",
    )
    if warning := untested(cfg):
        log.warning("%s", warning)
    check_cluster(cfg, model_path=model_path)
    memory, fits = dry_run_report(cfg, model_path=str(model_path))  # GPU runs: the memory plan must fit
    if not fits:
        raise ConfigError(f"the memory plan does not fit:\n{memory}")
    return model_path


def check_reward(cfg: Config) -> str:
    """`reward.fn` imports here, as the start imports it in the driver before any actor."""
    from exgrpo.verify.plugin import RewardError, resolve
    from exgrpo.verify.rewards import MATH

    if cfg.reward.fn == MATH:
        return "reward: math (the answer verifier)"
    try:
        resolve(cfg.reward.fn)
    except RewardError as err:
        raise ConfigError(str(err)) from err
    return f"reward: {cfg.reward.fn} imports and takes (prompt, completion, fields)"


def model_dir(cfg: Config) -> Path | None:
    """The model directory a start would load, when it exists without building or downloading anything (None: a
    builtin that is built at start, or a hub id not in the hub cache that a start downloads)."""
    from exgrpo.models.resolve import (
        BUILTIN_MODELS,
        MANIFEST,
        ModelResolveError,
        cached_hub,
        check_model_dir,
        hub_id,
        hub_offline,
        known_models,
        resolve_hub,
        shipped_model,
    )

    name = builtin_name(cfg.model.path)
    if name is not None:
        if name in MANIFEST:
            return shipped_model(name)
        if name not in BUILTIN_MODELS:
            raise ModelResolveError(f"unknown builtin model {cfg.model.path!r}; known: {known_models()}")
        built = (
            Path(cfg.model.cache_dir).expanduser() / "models" / f"{name}-{BUILTIN_MODELS[name].fingerprint}"
        )
        return built if (built / "config.json").is_file() else None
    path = Path(cfg.model.path).expanduser()
    if not path.is_dir() and hub_id(cfg.model.path) is not None:
        # as a start resolves it (`resolve_model`): the hub cache, else (offline) the start's own error, else
        # None: a start downloads it (the dry run downloads nothing)
        cached = cached_hub(cfg.model.path)
        if cached is None and hub_offline():
            return resolve_hub(cfg.model.path).path  # raises the start's error: not cached, offline
        return cached.path if cached is not None else None
    if not path.is_dir():
        raise ModelResolveError(
            f"model path {cfg.model.path!r} does not exist; give an HF model directory, a hub model id "
            f"(org/name or org/name@revision) or one of {known_models()}"
        )
    check_model_dir(path, spec=cfg.model.path)
    return path


def model_line(cfg: Config, path: Path | None) -> str:
    """What the dry run says of the model: its directory, a hub id's snapshot, or what a start builds or
    downloads."""
    from huggingface_hub import constants

    from exgrpo.models.resolve import hub_id

    spec = cfg.model.path
    if builtin_name(spec) is not None or Path(spec).expanduser().is_dir() or hub_id(spec) is None:
        return f"model: {spec}" + (f" ({path})" if path else " (a builtin, built at start)")
    if path is not None:
        return f"model: {spec} -> {path} (hub cache, commit {path.name[:12]})"
    return (
        f"model: {spec} is not in the hub cache ({constants.HF_HUB_CACHE}): a start downloads it from the hub "
        "(HF_HUB_OFFLINE is not set); the dry run downloads nothing"
    )


def check_model(cfg: Config) -> list[str]:
    """The model directory, and LoRA's target modules against its module names."""
    path = model_dir(cfg)
    lines = [model_line(cfg, path)]
    if cfg.learners.lora_rank > 0:
        if path is None:
            lines.append("LoRA targets: not checked (the model is built or downloaded at start)")
        else:
            lines.append(check_lora_targets(path, cfg.learners.lora_target_modules))
    return lines


def module_names(path: Path) -> list[str]:
    """The module names of the model in `path`, from its config.json on the meta device (no weights read)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(path)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return [name for name, _ in model.named_modules()]


def check_lora_targets(path: Path, targets: tuple[str, ...] | list[str]) -> str:
    """Every `learners.lora_target_modules` entry names a module of the model, as PEFT matches them (the
    module's name or its last dotted parts); a target that matches nothing is refused, naming the choices."""
    names = module_names(path)
    missing = [t for t in targets if not any(n == t or n.endswith("." + t) for n in names)]
    if missing:
        leaves = sorted({n.rsplit(".", 1)[-1] for n in names if n and not n.rsplit(".", 1)[-1].isdigit()})
        raise ConfigError(
            f"learners.lora_target_modules: {', '.join(missing)} matches no module of {path}; its layer names "
            f"are {', '.join(leaves)}"
        )
    return f"LoRA targets: {', '.join(targets)} found in the model"


def check_data(cfg: Config, *, model_path: Path | None = None) -> str:
    """The train and eval data read into prompts as a start reads them (files exist, layouts fit, bad rows
    under `data.on_bad_row`), and their lengths against `model.max_prompt_len` when the model is at hand."""
    from exgrpo.data.sources import load_prompts

    train, evaluation = load_prompts(cfg)
    line = f"data: {len(train)} train / {len(evaluation)} eval questions ({cfg.data.train})"
    if model_path is None:
        return line + "; prompt lengths checked at start (the model is built then)"
    train, evaluation, note = enforce_prompt_lengths(cfg, model_path, train, evaluation)
    return f"{line}; prompts within model.max_prompt_len={cfg.model.max_prompt_len} tokens" + (
        f"; {note}" if note else ""
    )


def enforce_prompt_lengths(
    cfg: Config, model_path: Path | str, train: list[Prompt], evaluation: list[Prompt]
) -> tuple[list[Prompt], list[Prompt], str]:
    """`model.max_prompt_len` on the train and eval prompts under `data.long_prompts` (exgrpo.data.lengths):
    the prompts kept and a note of those skipped ("" when none), or the `DataError` naming the long rows."""
    from transformers import AutoTokenizer

    from exgrpo.data.lengths import check_prompt_lengths, describe

    tokenizer = AutoTokenizer.from_pretrained(str(model_path))
    kept, notes = [], []
    for prompts, what in ((train, f"data.train={cfg.data.train}"), (evaluation, "the held-out data")):
        got = (
            check_prompt_lengths(
                prompts,
                template=cfg.model.template,
                tokenizer=tokenizer,
                limit=cfg.model.max_prompt_len,
                policy=cfg.data.long_prompts,
                what=what,
            )
            if prompts
            else None
        )
        kept.append(got.kept if got else prompts)
        if got and got.long:
            notes.append(f"{what}: skipped {len(got.long)} of {len(prompts)} ({describe(got.long)})")
    note = "prompts longer than model.max_prompt_len left out (data.long_prompts=skip): " + "; ".join(notes)
    note = note if notes else ""
    return kept[0], kept[1], note
