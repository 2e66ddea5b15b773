"""The Python entry point: `from exgrpo import train`.

    from exgrpo import train

    def shorter(prompt, completion, fields):          # any callable; a closure or a lambda too
        return 1.0 if len(completion) <= fields["limit"] else 0.0

    result = train(
        "tiny-cpu",                                   # a config file, a packaged config name or a Config
        overrides=["trainer.steps=2"],                # the command line's key=value overrides
        reward_fn=shorter,                            # or [(f, 1.0), (g, 0.5)]: a weighted sum
        train_data=[{"question": "...", "answer": "", "limit": 12}, ...],   # rows in memory
    )
    print(result.run_dir, result.records[-1]["reward/mean"])

It runs what `python -m exgrpo.run` runs (`exgrpo.runtime.recipe.train`) on the same cluster choice (`RAY_ADDRESS`,
else a local cluster, shut down afterwards when this call started it). `reward_fn` is shipped by value with
cloudpickle to the verifier's worker processes (`exgrpo.verify.closure`) and run there exactly as a
`reward.fn` function: under `samplers.verify_timeout_s`, isolated, a raise or hang scored 0 and counted.
`train_data` / `eval_data` (lists of dicts, or anything with `to_list()` such as a `datasets.Dataset`) are
written as JSON lines into the run directory (`<run_dir>/data/`) and read from there like a dataset file,
so the run dir holds everything `python -m exgrpo.run --resume` needs (docs/data.md has the columns).
"""

from __future__ import annotations

import datetime as dt
import json
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from exgrpo.core.config import Config
from exgrpo.runtime.healing import RunResult
from exgrpo.runtime.run_dir import job_run_dir

__all__ = ["RunResult", "train"]

Rows = Iterable[Mapping[str, Any]]


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
        spec = pack(combine(reward_fn))
        cfg = dataclasses.replace(cfg, reward=dataclasses.replace(cfg.reward, fn=spec))
    if train_data is not None or eval_data is not None:
        cfg = job_run_dir(cfg)
        run_dir = Path(cfg.logging.run_dir or _fresh_run_dir()).expanduser().resolve()
        data_dir = run_dir / "data"
        data_overrides = [f"logging.run_dir={run_dir}"]
        if train_data is not None:
            data_overrides.append(f"data.train={_write_rows(train_data, data_dir / 'train.jsonl')}")
        if eval_data is not None:
            data_overrides.append(f"data.eval={_write_rows(eval_data, data_dir / 'eval.jsonl')}")
        cfg = apply_overrides(cfg, tuple(data_overrides))
    started_here = not ray.is_initialized() and not os.environ.get("RAY_ADDRESS")
    try:
        return recipe.train(cfg)
    finally:
        if started_here:
            ray.shutdown()


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
                raise TypeError(f"row {n} of {path.stem}_data is {type(row).__name__}, not a dict")
            f.write(json.dumps(dict(row), default=_plain, ensure_ascii=False) + "\n")
            n += 1
    if n == 0:
        raise ValueError(f"{path.stem}_data has no rows")
    return path


def _plain(value: Any) -> Any:
    """numpy scalars and arrays (as `datasets` yields them) as plain JSON values."""
    for attr in ("tolist", "item"):
        if hasattr(value, attr):
            return getattr(value, attr)()
    raise TypeError(f"a row holds {type(value).__name__}, which JSON cannot hold")
