"""The Python entry point: `from exgrpo import train`.

`train(config, overrides=, reward_fn=, train_data=, eval_data=)` runs what `python -m exgrpo.run` runs
(`exgrpo.runtime.recipe.train`) on the same cluster choice. A `reward_fn` runs in the verifier's workers exactly
as a `reward.fn` (deadline, isolation, failures scored 0); rows in memory are written into `<run_dir>/data/`, so
the run dir holds what `--resume` needs, and a bad row is named by its index before anything starts. With
`logging.progress=false` (no phase lines, no step bar) it prints one line before the start-up naming what it
starts (`quiet_start`), then nothing until the summary. More:
README.md ("Python API"), docs/data.md ("Rows in memory"); tests: tests/integration/test_api.py.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import re
import shutil
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from exgrpo.core.config import Config, ConfigError
from exgrpo.runtime.healing import RunResult
from exgrpo.runtime.run_dir import job_run_dir

__all__ = ["RunResult", "train"]

Rows = Iterable[Mapping[str, Any]]
log = logging.getLogger("exgrpo")
_SHOWN = 5  # bad rows named in a message


def train(
    config: str | os.PathLike[str] | Config | None = None,
    *,
    overrides: Sequence[str] = (),
    reward_fn: Callable[[str, str, dict[str, Any]], Any] | Sequence[Any] | None = None,
    train_data: Rows | Any | None = None,
    eval_data: Rows | Any | None = None,
) -> RunResult:
    """Train once and return the `RunResult` (run dir, step records, held-out evaluations, wall time).

    `config`: a YAML path, a packaged config name (`tiny-cpu`) or a `Config`; None is the embedded default.
    `overrides`: `key.sub=value` strings, applied after `config`. `reward_fn`: a callable
    `(prompt, completion, fields) -> float` (sets `reward.fn`), or a list of callables and (callable, weight)
    pairs summed with their weights. `train_data` / `eval_data`: rows (dicts) in memory, or a
    `datasets.Dataset`; they replace `data.train` / `data.eval` (train rows without eval rows: the held-out
    set is `data.eval` as configured, or none when the config trains on a builtin task's split).
    Bad input raises `ConfigError`, `DataError` or `ModelResolveError` before any actor starts.
    """
    import dataclasses

    import ray

    from exgrpo.core.config_files import apply_overrides, load_config
    from exgrpo.runtime import recipe
    from exgrpo.verify.closure import combine, pack

    if isinstance(config, Config):
        cfg = apply_overrides(config, tuple(overrides))
    else:
        cfg = load_config(config, tuple(overrides))
    if reward_fn is not None:
        if isinstance(reward_fn, str | os.PathLike):
            raise TypeError(
                f"reward_fn takes a Python callable (or a list of callables and (callable, weight) pairs), not "
                f"{type(reward_fn).__name__} {str(reward_fn)!r}; for a function in a file or module, pass "
                f"overrides=['reward.fn={reward_fn}'] (file.py:function or package.module:function)"
            )
        spec = pack(combine(reward_fn))
        cfg = dataclasses.replace(cfg, reward=dataclasses.replace(cfg.reward, fn=spec))
    from exgrpo.runtime.run_dir import self_contained

    made: Path | None = None  # the run directory this call made (removed again when the start is refused)
    if train_data is not None or eval_data is not None:
        cfg, made = _with_rows(cfg, train_data, eval_data)
    started_here = not ray.is_initialized() and not os.environ.get("RAY_ADDRESS")
    try:
        # a run directory that works from anywhere, as the command line's: absolute paths, a reward file copied
        cfg, copied = self_contained(cfg)
        made = made or copied
        if not cfg.logging.progress:  # no phase lines nor step bar: one line, so the caller knows it started
            print(quiet_start(cfg), file=sys.stderr, flush=True)
        return recipe.train(cfg)
    except _refused():
        _forget(made)
        raise
    finally:
        if started_here:
            ray.shutdown()


def quiet_start(cfg: Config) -> str:
    """The line a start with `logging.progress=false` prints: what it starts, and that it stays quiet."""
    from exgrpo.reporting.console import PREFIX

    def n(count: int, what: str) -> str:
        return f"{count} {what}{'' if count == 1 else 's'}"

    run_dir = f"; metrics in {cfg.logging.run_dir}/metrics.jsonl" if cfg.logging.run_dir else ""
    return (
        f"{PREFIX} starting Ray and {n(cfg.samplers.num, 'sampler')}, {n(cfg.learners.num, 'learner')}, "
        f"{n(cfg.replay.num_shards, 'replay shard')} to train {cfg.model.path} for {n(cfg.trainer.steps, 'step')}; "
        f"quiet until the summary (logging.progress=false){run_dir}"
    )


def _refused() -> tuple[type[BaseException], ...]:
    """What a refused start raises: bad input, nothing trained (the command line's exit 2, `exgrpo.run`)."""
    from exgrpo.data.readers import DataError
    from exgrpo.loop.checkpoint import ResumeError
    from exgrpo.models.resolve import ModelResolveError
    from exgrpo.runtime.env import RayStartError

    return (ConfigError, DataError, ModelResolveError, ResumeError, FileNotFoundError, RayStartError)


def _forget(made: Path | None) -> None:
    """Remove the run directory this call made when its start was refused (never one holding a checkpoint)."""
    from exgrpo.loop.checkpoint import latest_checkpoint

    if made is not None and made.is_dir() and latest_checkpoint(made) is None:
        shutil.rmtree(made, ignore_errors=True)
        log.info("removed %s: the start was refused before any step", made)


def _with_rows(
    cfg: Config, train_data: Rows | Any | None, eval_data: Rows | Any | None
) -> tuple[Config, Path | None]:
    """The config reading the rows from `<run_dir>/data/`, written and checked there; and the run directory
    when this call made it."""
    from exgrpo.core.config_files import apply_overrides
    from exgrpo.loop.checkpoint import fresh_run_dir_check

    cfg = job_run_dir(cfg)
    fresh_run_dir_check(cfg)  # never over another run's checkpoints (nor its data files)
    run_dir = Path(cfg.logging.run_dir or _fresh_run_dir()).expanduser().resolve()
    made = None if run_dir.exists() else run_dir
    data_overrides = [f"logging.run_dir={run_dir}"]
    try:
        for key, rows in (("train", train_data), ("eval", eval_data)):
            if rows is not None:
                path = _write_rows(rows, run_dir / "data" / f"{key}.jsonl")
                _check_rows(cfg, path, f"{key}_data")
                data_overrides.append(f"data.{key}={path}")
    except BaseException:
        _forget(made)
        raise
    return apply_overrides(cfg, tuple(data_overrides)), made


def _fresh_run_dir() -> Path:
    """runs/<time> under the current directory, as a CLI run would use (a suffix if it exists)."""
    base = Path("runs") / f"{dt.datetime.now():%Y%m%d-%H%M%S}"
    run_dir, n = base, 1
    while run_dir.exists():
        n += 1
        run_dir = base.with_name(f"{base.name}-{n}")
    return run_dir


def _write_rows(rows: Rows | Any, path: Path) -> Path:
    """Rows (dicts, or a `datasets.Dataset`) as JSON lines at `path`."""
    if isinstance(rows, str | os.PathLike):
        raise TypeError(
            f"train_data/eval_data take rows (a list of dicts or a datasets.Dataset); for a file, pass "
            f"overrides=['data.train={rows}']"
        )
    if hasattr(rows, "to_list"):  # datasets.Dataset, pyarrow.Table
        rows = rows.to_list()
    path.parent.mkdir(parents=True, exist_ok=True)
    n = 0
    with path.open("w", encoding="utf-8") as f:
        for row in rows:
            if not isinstance(row, Mapping):
                raise TypeError(f"{path.stem}_data[{n}] is {type(row).__name__}, not a dict")
            f.write(json.dumps(dict(row), default=_plain, ensure_ascii=False) + "\n")
            n += 1
    if n == 0:
        raise ValueError(f"{path.stem}_data has no rows")
    return path


def _check_rows(cfg: Config, path: Path, name: str) -> None:
    """Read `path` as the run will (`data.*`); a bad row is named as `name[i]` with its value: `data.on_bad_row`
    error raises a `DataError`, skip logs them and blanks their lines (the reader passes blank lines over)."""
    from exgrpo.data.readers import DataError, read_prompts

    d = cfg.data
    try:
        result = read_prompts(
            path,
            question_key=d.question_key,
            answer_key=d.answer_key,
            on_bad_row="skip",
            for_reward_fn=cfg.reward.fn != "math",
        )
    except DataError as err:  # no row usable, or no layout fits the columns
        text = re.sub(r"\brow (\d+)\b", rf"{name}[\1]", str(err).replace(repr(str(path)), name))
        raise DataError(text.replace(str(path), name)) from None
    if not result.skipped:
        return
    lines = path.read_text(encoding="utf-8").split("\n")
    listed = "; ".join(f"{name}[{b.row}] {_shown(lines[b.row])}: {b.reason}" for b in result.skipped[:_SHOWN])
    more = f"; and {len(result.skipped) - _SHOWN} more" if len(result.skipped) > _SHOWN else ""
    what = (
        f"{len(result.skipped)} of {len(result.skipped) + len(result.prompts)} rows of {name} are malformed"
    )
    if d.on_bad_row == "error":
        raise DataError(f"{what}: {listed}{more}; to skip them with a count, set data.on_bad_row=skip")
    log.warning(
        "%s, skipped (data.on_bad_row=skip; set data.on_bad_row=error to fail instead): %s%s",
        what,
        listed,
        more,
    )
    for b in result.skipped:
        lines[b.row] = ""
    path.write_text("\n".join(lines), encoding="utf-8")


def _shown(line: str, limit: int = 120) -> str:
    """A row's value as the caller wrote it (a Python dict), cut to `limit` characters."""
    text = repr(json.loads(line))
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _plain(value: Any) -> Any:
    """numpy scalars and arrays (as `datasets` yields them) as plain JSON values."""
    for attr in ("tolist", "item"):
        if hasattr(value, attr):
            return getattr(value, attr)()
    raise TypeError(f"a row holds {type(value).__name__}, which JSON cannot hold")
