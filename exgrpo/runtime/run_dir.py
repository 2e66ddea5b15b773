"""A run's directory: where it goes (a submitted job's default), the checks on it, making it, and the
lines a finished run prints about it (the checkpoint a stopped run continues from, the report).

A job submitted with `ray job submit --working-dir` runs in Ray's temporary copy of that directory, so
its default run directory is an absolute one outside it (`job_run_dir`); on a cluster a relative run
directory is refused (`check_run_dir`), because learner ranks on other nodes write checkpoints there.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
import platform
import shutil
from pathlib import Path

from exgrpo.core.config import Config, ConfigError
from exgrpo.reporting.console import PREFIX


def submitted_with_working_dir() -> bool:
    """Whether this driver is a `ray job submit --working-dir ...` entrypoint (it runs in Ray's copy of it)."""
    job = json.loads(os.environ.get("RAY_JOB_CONFIG_JSON_ENV_VAR") or "{}")
    return bool((job.get("runtime_env") or {}).get("working_dir"))


# where a submitted job's runs go when it sets no logging.run_dir (a directory on the driver's node)
JOB_RUNS_ENV = "EXGRPO_RUNS_DIR"
JOB_RUNS_DEFAULT = "~/exgrpo-runs"


def job_run_dir(cfg: Config) -> Config:
    """A job submitted with `--working-dir` that sets no `logging.run_dir` writes to `<root>/<time>`, an absolute
    path that outlives the job's temporary copy of the working directory: root is `$EXGRPO_RUNS_DIR`, else
    `~/exgrpo-runs` of the user running the driver. Any other config is returned as it is."""
    if cfg.logging.run_dir or not submitted_with_working_dir():
        return cfg
    root = Path(os.environ.get(JOB_RUNS_ENV) or JOB_RUNS_DEFAULT).expanduser().resolve()
    run_dir = str(root / f"{dt.datetime.now():%Y%m%d-%H%M%S}")
    return dataclasses.replace(cfg, logging=dataclasses.replace(cfg.logging, run_dir=run_dir))


def shared_run_dir_note(run_dir: Path, *, nodes: int) -> str:
    """On a cluster of several nodes: where checkpoints land and what every node must share."""
    return (
        f"{PREFIX} {nodes} nodes: checkpoints land in {run_dir.resolve()}/checkpoints; learner ranks on other "
        f"nodes write their weights there on their own node, so {run_dir.resolve().parent} must be one directory "
        f"every node mounts (else the first checkpoint fails, saying so): set {JOB_RUNS_ENV} or "
        "logging.run_dir to shared storage (docs/operating.md, 'Two nodes')"
    )


def check_run_dir(cfg: Config, *, nodes: int = 1) -> None:
    """Refuse a relative `logging.run_dir` on a cluster (RAY_ADDRESS, a submitted job, or more than one node).

    On a cluster, learner ranks on other nodes write checkpoints and replay logs under the run dir: it must be
    one absolute path on storage every node mounts (a relative one lands in Ray's per-job temporary copy of
    the working directory, or in a different directory on every node). See docs/operating.md, "Two nodes".
    """
    if Path(cfg.logging.run_dir or "runs").expanduser().is_absolute():
        return
    why = (
        "this is a job submitted with --working-dir (its copy is deleted after the job)"
        if submitted_with_working_dir()
        else "RAY_ADDRESS is set (an existing cluster)"
        if os.environ.get("RAY_ADDRESS")
        else f"the Ray cluster has {nodes} nodes"
        if nodes > 1
        else ""
    )
    if why:
        raise ConfigError(
            f"logging.run_dir={cfg.logging.run_dir or '(unset: runs/<time>)'} is relative but {why}; set "
            "logging.run_dir to an absolute path on storage every node shares (docs/operating.md, 'Two nodes')"
        )


REWARD_COPY = "reward"  # under the run dir: the copy of a reward file (`reward.fn=path/to/file.py:fn`)


def self_contained(cfg: Config) -> tuple[Config, Path | None]:
    """`cfg` for a fresh command-line start whose run directory works from any directory: `data.*` and
    `model.path` files absolute (as a packaged config's, `anchor_paths`), and a reward file copied into
    `<run_dir>/reward/` with `reward.fn` pointing at the copy (a callable of the Python API travels in the config
    already, `exgrpo.verify.closure`). A reward file that imports files beside it stays where it is, absolute.
    Returns the config and the run directory made for the copy (None when none was made: the caller removes it
    when the start is refused). Relative paths are read from the current directory, as the start reads them."""
    from exgrpo.core.config_files import PATH_KEYS, anchor_paths, apply_overrides

    data = anchor_paths(cfg.to_dict(), Path.cwd())
    overrides = [f"{s}.{k}={data[s][k]}" for s, k in PATH_KEYS if data[s][k] != cfg.to_dict()[s][k]]
    made = None
    file, _, name = cfg.reward.fn.rpartition(":")
    source = Path(file).expanduser().resolve()
    if file.endswith(".py") and source.is_file() and not _imports_siblings(source):
        cfg = job_run_dir(cfg)
        run_dir = Path(cfg.logging.run_dir or f"runs/{dt.datetime.now():%Y%m%d-%H%M%S}").expanduser()
        target = run_dir.resolve() / REWARD_COPY / source.name
        if target != source:
            made = None if run_dir.exists() else run_dir.resolve()
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
            overrides = [o for o in overrides if not o.startswith("reward.fn=")]
            overrides += [f"reward.fn={target}:{name}", f"logging.run_dir={run_dir}"]
    return (apply_overrides(cfg, overrides) if overrides else cfg), made


def _imports_siblings(file: Path) -> bool:
    """Whether a reward file imports a module that lives beside it (a copy alone would not import)."""
    import ast

    try:
        tree = ast.parse(file.read_text(encoding="utf-8"))
    except (SyntaxError, UnicodeDecodeError):
        return True  # the start reports it, from where it is
    names = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    names |= {
        n.module.split(".")[0]
        for n in ast.walk(tree)
        if isinstance(n, ast.ImportFrom) and n.module and not n.level
    }
    if any(isinstance(n, ast.ImportFrom) and n.level for n in ast.walk(tree)):
        return True
    return any((file.parent / f"{m}.py").is_file() or (file.parent / m).is_dir() for m in names)


def make_run_dir(cfg: Config) -> Path:
    run_dir = Path(cfg.logging.run_dir or f"runs/{dt.datetime.now():%Y%m%d-%H%M%S}").expanduser()
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(cfg.to_yaml())
    return run_dir


def open_run_dir(cfg: Config, *, new: bool, defaulted: bool) -> tuple[Path, bool]:
    """Make the run directory (`make_run_dir`); returns it and whether this start made it (`new`: a fresh
    start, not a resume nor a recovery, over a directory that did not exist), to remove it again when the
    start is refused. `defaulted`: a submitted job's default directory, printed with how to choose one."""
    fresh = not cfg.logging.run_dir or not Path(cfg.logging.run_dir).expanduser().exists()
    made = fresh and new
    run_dir = make_run_dir(cfg)
    if defaulted:
        print(
            f"{PREFIX} run directory {run_dir} (a submitted job's default on the driver's node "
            f"{platform.node()}; set logging.run_dir or {JOB_RUNS_ENV} to choose)",
            flush=True,
        )
    return run_dir, made


def closing_lines(run_dir: Path, *, stopped: str | None) -> tuple[str, str | None]:
    """What a finished run prints: its directory, for a stopped run the checkpoint and the command that
    continues it (returned too, None without a checkpoint), and its report when one was written."""
    where = f"{PREFIX} run directory {run_dir.resolve()}"
    resume = None
    if stopped is not None:
        from exgrpo.loop.checkpoint import latest_checkpoint

        ckpt = latest_checkpoint(run_dir)
        resume = f"python -m exgrpo.run --resume {run_dir}" if ckpt else None
        where += f"\n{PREFIX} {stopped}; " + (
            f"checkpoint {ckpt.name}; continue with: {resume}" if ckpt else "no checkpoint was written"
        )
    if (run_dir / "report.html").is_file():
        where += f"\n{PREFIX} report {(run_dir / 'report.html').resolve()}"
    return where, resume
