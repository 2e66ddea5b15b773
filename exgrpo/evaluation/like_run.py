"""Evaluating a run's model as the run did, and where the result goes (`python -m exgrpo.evaluate`).

`like_run`: the options of a run's own held-out evaluation, from its config.yaml (`--like-run RUN_DIR`);
`run_model_dir`: a run directory given as `--model` is its final model (an unfinished run's is refused,
naming its latest checkpoint's), and `unfinished_run` says the same for `--like-run`; `default_out`: the JSON
beside a model directory of the user's own, or in the current directory for a `builtin:` model or a hub id
(never inside a cache), and `free_out` the next free name beside an earlier evaluation's; `first_questions`:
a file's first `--num` questions; `response_budget`: the response tokens asked for, at most what
the model's context (`context_length`) leaves after the longest prompt, so generation never runs past it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from exgrpo.data.sources import SourceData


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


def default_out(model: str, model_dir: Path, data_name: str, *, cache_dir: str | None = None) -> Path:
    """Where the JSON goes without --out: beside a model directory of the user's own; in the current directory
    for a `builtin:` model, a hub id, or any model that lives in a cache (`cache_dir`, the hub's)."""
    from exgrpo.models.resolve import hub_id

    hub = hub_id(model) is not None and not Path(model).expanduser().is_dir()
    if not (model.startswith("builtin:") or hub or _in_cache(model_dir, cache_dir)):
        return model_dir / f"eval-{data_name}.json"
    name = model.removeprefix("builtin:").replace("/", "--").replace("@", "-") if hub or ":" in model else ""
    name = name or model_dir.name  # a cached model given by its path
    return Path(f"eval-{name}-{data_name}.json")


def _in_cache(model_dir: Path, cache_dir: str | None) -> bool:
    """Whether `model_dir` lies inside exgrpo's model cache or Hugging Face's hub cache."""
    import os

    hf_home = os.environ.get("HF_HOME", "~/.cache/huggingface")
    caches = [Path(hf_home).expanduser(), *([Path(cache_dir).expanduser()] if cache_dir else [])]
    where = model_dir.expanduser().resolve()
    return any(where.is_relative_to(c.resolve()) for c in caches)


def first_questions(data: SourceData, num: int) -> SourceData:
    """`data` cut to its first `num` questions, saying so (`--num` for a file; a builtin split has `num`)."""
    import sys
    from dataclasses import replace

    if len(data.prompts) <= num:
        return data
    print(f"evaluating the first {num} of {len(data.prompts)} questions (--num {num})", file=sys.stderr)
    return replace(data, prompts=data.prompts[:num])


def free_out(out: Path) -> Path:
    """The first of `out`, `<stem>-2<suffix>`, `<stem>-3<suffix>`, ... that does not exist."""
    path, n = out, 1
    while path.exists():
        n += 1
        path = out.with_name(f"{out.stem}-{n}{out.suffix}")
    return path


def unfinished_run(run_dir: Path) -> str:
    """What `--like-run` of a run without a final model says: the step it stopped at, and the latest
    checkpoint's model to evaluate instead (or that it has none)."""
    from exgrpo.core.config_files import load_config
    from exgrpo.loop.checkpoint import checkpoint_step, latest_checkpoint

    steps = load_config(str(run_dir / "config.yaml"), []).trainer.steps
    ckpt = latest_checkpoint(run_dir)
    done = checkpoint_step(ckpt) if ckpt else 0
    metrics = run_dir / "metrics.jsonl"
    if metrics.is_file():  # the last step it logged (past its checkpoint, when it died between two)
        for line in metrics.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                done = max(done, int(json.loads(line).get("step", -1)) + 1)
            except (ValueError, AttributeError, TypeError):
                continue
    if ckpt is None:
        return (
            f"--like-run {run_dir}: the run stopped after step {done} of {steps} and has no final model and no "
            f"checkpoint to evaluate (continue it: python -m exgrpo.run --resume {run_dir})"
        )
    return (
        f"--like-run {run_dir}: the run stopped after step {done} of {steps} (no final model); evaluate its latest "
        f"checkpoint ({ckpt.name}) with: python -m exgrpo.evaluate --like-run {run_dir} --model {ckpt / 'model'} "
        f"(or continue the run: python -m exgrpo.run --resume {run_dir})"
    )


DEFAULT_MAX_TOKENS = 4096  # response budget when --max-tokens is not given (capped by the context)


def context_length(model_dir: Path) -> int | None:
    """The model's context (`max_position_embeddings` of its config.json), None when it does not say."""
    try:
        config = json.loads((Path(model_dir) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    value = config.get("max_position_embeddings")
    return value if isinstance(value, int) and value > 0 else None


def response_budget(
    requested: int | None, *, context: int | None, longest_prompt: int
) -> tuple[int, str | None]:
    """The response tokens to ask for and a note when an explicit `requested` was capped: `requested`, else
    `DEFAULT_MAX_TOKENS`, at most what `context` leaves after the longest prompt (at least 1)."""
    wanted = DEFAULT_MAX_TOKENS if requested is None else requested
    if context is None:
        return wanted, None
    room = max(1, context - longest_prompt)
    if wanted <= room:
        return wanted, None
    note = None
    if requested is not None:
        note = (
            f"--max-tokens {requested} is more than the model's context leaves ({context} tokens, the longest "
            f"prompt {longest_prompt}): capped to {room}"
        )
    return room, note
