"""Evaluating a run's model as the run did, and where the result goes (`python -m exgrpo.evaluate`).

`like_run`: the options of a run's own held-out evaluation, from its config.yaml (`--like-run RUN_DIR`);
`run_model_dir`: a run directory given as `--model` is its final model (an unfinished run's is refused,
naming its latest checkpoint's); `default_out`: the JSON beside the model, or in the current directory
for a hub id (never inside the hub cache).
"""

from __future__ import annotations

from pathlib import Path


def like_run(run_dir: Path) -> dict[str, object]:
    """The options a run's own evaluation used, from its config.yaml (`--like-run`)."""
    from exgrpo.core.config_files import load_config

    config = run_dir / "config.yaml"
    if not config.is_file():
        raise ValueError(f"--like-run {run_dir}: no config.yaml there (give a run directory, runs/<id>)")
    cfg = load_config(str(config), [])
    return {
        "model": str(run_dir / "final"),
        "data": cfg.data.eval or cfg.data.train,
        "num": cfg.data.num_eval,
        "n": cfg.trainer.eval_samples,
        "temperature": cfg.samplers.temperature,
        "top_p": cfg.samplers.top_p,
        "max_tokens": cfg.model.max_response_len,
        "template": cfg.model.template,
        "question_key": cfg.data.question_key,
        "answer_key": cfg.data.answer_key,
        "seed": cfg.data.seed,
        "dtype": cfg.model.dtype,
        "verify_timeout": cfg.samplers.verify_timeout_s,
        "reward_fn": cfg.reward.fn,
    }


def run_model_dir(model: str) -> tuple[str, str | None]:
    """`--model` as given, or a run directory's final model with a note saying so."""
    path = Path(model).expanduser()
    if path.is_dir() and not (path / "config.json").is_file():
        if (path / "final" / "config.json").is_file():
            return str(
                path / "final"
            ), f"{model} is a run directory; evaluating its final model {path / 'final'}"
        if (path / "run.json").is_file() or (path / "config.yaml").is_file():
            from exgrpo.loop.checkpoint import latest_checkpoint

            ckpt = latest_checkpoint(path)
            use = (
                f"its latest checkpoint's model: --model {ckpt / 'model'}" if ckpt else "it has no checkpoint"
            )
            raise ValueError(f"--model {model} is a run directory without a final model (unfinished); {use}")
    return model, None


def default_out(model: str, model_dir: Path, data_name: str) -> Path:
    """Where the JSON goes without --out: beside the model, or for a hub id in the current directory."""
    from exgrpo.models.resolve import hub_id

    if hub_id(model) is not None and not Path(model).expanduser().is_dir():
        return Path(f"eval-{model.replace('/', '--').replace('@', '-')}-{data_name}.json")
    return model_dir / f"eval-{data_name}.json"
