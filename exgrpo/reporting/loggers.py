"""Logger backends behind `exgrpo.reporting.loggers.MetricsLogger`: JSONL (always), TensorBoard, W&B, Ray gauges.

Every backend receives the same record (the metric names of `exgrpo/core/metric_names.py`, docs/metrics.md)
and the same step; none renames a key, so `rollout/mean_reward` is that tag in TensorBoard, that
key in W&B and `ray_exgrpo_rollout_mean_reward` in Prometheus. The run id and the resolved config
are recorded by each: `run.json` beside `metrics.jsonl`, a text summary and the `hparams` of
TensorBoard, the run id and config of W&B.

Optional dependencies (`pip install -e '.[logging]'`, installed by scripts/setup.sh):
`tensorboard` (written through `torch.utils.tensorboard`) and `wandb`. W&B runs offline unless
`logging.wandb_mode=online` (or WANDB_MODE) says otherwise: it needs no account and no network,
and `wandb sync <run_dir>/wandb/offline-run-*` uploads later. Nothing here imports torch, wandb or
Ray at module level (the module is importable where none is installed).
"""

from __future__ import annotations

import json
import math
import os
import re
import secrets
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from exgrpo.core.fileio import atomic_write_text
from exgrpo.core.metric_names import STEP, prometheus_name
from exgrpo.loop.observer import Observer

BACKENDS = ("jsonl", "tensorboard", "wandb")  # what `logging.backends` may list (jsonl is always on)
STEP_KEY = "step"


class Backend(Protocol):
    def log(self, record: Mapping[str, Any], step: int) -> None: ...

    def summary(self, values: Mapping[str, Any]) -> None: ...

    def samples(self, rows: Sequence[Mapping[str, Any]], step: int) -> None: ...

    def close(self) -> None: ...


def numeric(record: Mapping[str, Any]) -> dict[str, float]:
    """The finite numbers of a record (bools and the step excluded): what scalar backends plot."""
    out = {}
    for key, value in record.items():
        if key == STEP_KEY or isinstance(value, bool) or not isinstance(value, int | float):
            continue
        if math.isfinite(value):
            out[key] = float(value)
    return out


def jsonable(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if hasattr(v, "item"):
        return v.item()
    return v


_RUN_ID_RE = re.compile(r"[^A-Za-z0-9_-]")


def new_run_id(run_dir: Path) -> str:
    """`<run dir name>-<6 hex>`: readable, unique across machines, valid as a W&B run id."""
    return f"{_RUN_ID_RE.sub('-', Path(run_dir).resolve().name)[:48]}-{secrets.token_hex(3)}"


def run_identity(run_dir: Path, config: Mapping[str, Any] | None) -> dict[str, Any]:
    """`<run_dir>/run.json` ({run_id, started, config}); a resumed run keeps its id."""
    path = Path(run_dir) / "run.json"
    if path.exists():
        info = json.loads(path.read_text())
        if config is not None:
            info["config"] = dict(config)
    else:
        info = {
            "run_id": new_run_id(run_dir),
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "config": dict(config or {}),
        }
    tmp = path.with_name(".run.json.tmp")
    tmp.write_text(json.dumps(info, indent=2, default=str))
    os.replace(tmp, path)
    return info


class JsonlBackend:
    """`<run_dir>/metrics.jsonl`: one JSON object per step, keys as logged (the contract of docs/metrics.md)."""

    def __init__(self, run_dir: Path) -> None:
        self.path = Path(run_dir) / "metrics.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("a", buffering=1)

    def log(self, record: Mapping[str, Any], step: int) -> None:
        self._file.write(json.dumps({k: jsonable(v) for k, v in record.items()}) + "\n")

    def summary(self, values: Mapping[str, Any]) -> None:
        pass  # the report writes summary.json

    def samples(self, rows: Sequence[Mapping[str, Any]], step: int) -> None:
        pass  # `exgrpo.reporting.samples.SampleLog` writes samples.jsonl

    def close(self) -> None:
        self._file.close()


class TensorBoardBackend:
    """Scalars under `<run_dir>/tensorboard/` (`tensorboard --logdir runs/`); tag = metric name."""

    def __init__(self, run_dir: Path, *, run_id: str, config: Mapping[str, Any] | None) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as e:  # torch.utils.tensorboard needs the tensorboard package
            raise ImportError(
                "logging.backends lists tensorboard but it is not installed: "
                "pip install -e '.[logging]' (scripts/setup.sh installs it)"
            ) from e
        self.log_dir = Path(run_dir) / "tensorboard"
        self._writer = SummaryWriter(log_dir=str(self.log_dir), flush_secs=10)
        self._writer.add_text("run_id", run_id, 0)
        if config is not None:
            import yaml

            self._writer.add_text(
                "config", "```\n" + yaml.safe_dump(dict(config), sort_keys=False) + "```", 0
            )
        self._config = config

    def log(self, record: Mapping[str, Any], step: int) -> None:
        for key, value in numeric(record).items():
            self._writer.add_scalar(key, value, step)

    def samples(self, rows: Sequence[Mapping[str, Any]], step: int) -> None:
        """The step's sampled completions as one text entry, tag `samples` (TensorBoard's Text tab)."""
        from exgrpo.reporting.samples import as_markdown

        self._writer.add_text("samples", as_markdown(rows), step)

    def summary(self, values: Mapping[str, Any]) -> None:
        flat = {k: v for k, v in values.items() if isinstance(v, int | float | str | bool)}
        self._writer.add_text("summary", "\n".join(f"    {k}: {v}" for k, v in flat.items()), 0)
        if self._config is not None:
            hparams = {
                f"{section}.{k}": v
                for section, keys in self._config.items()
                if isinstance(keys, dict)
                for k, v in keys.items()
                if isinstance(v, int | float | str | bool)
            }
            metrics = {f"final/{k}": float(v) for k, v in numeric(flat).items()}
            if metrics:
                self._writer.add_hparams(hparams, metrics, run_name=".")

    def close(self) -> None:
        self._writer.flush()
        self._writer.close()


class WandbBackend:
    """A W&B run (offline by default: `<run_dir>/wandb/offline-run-*`, `wandb sync` uploads it later)."""

    def __init__(
        self,
        run_dir: Path,
        *,
        run_id: str,
        config: Mapping[str, Any] | None,
        project: str,
        mode: str,
        quiet: bool = True,
    ) -> None:
        try:
            import wandb
        except ImportError as e:
            raise ImportError(
                "logging.backends lists wandb but it is not installed: "
                "pip install -e '.[logging]' (scripts/setup.sh installs it)"
            ) from e
        if quiet:
            os.environ.setdefault("WANDB_SILENT", "true")
        mode = os.environ.get("WANDB_MODE", mode)
        self._run = wandb.init(
            project=project,
            id=run_id,
            name=Path(run_dir).name,
            dir=str(run_dir),
            config=dict(config or {}),
            mode=mode,
            resume="allow",
            reinit="create_new",
            settings=wandb.Settings(console="off", x_disable_stats=True, silent=quiet),
        )
        self._run.define_metric(STEP_KEY)
        self._run.define_metric("*", step_metric=STEP_KEY)

    @property
    def dir(self) -> Path:
        """The run's directory (`.../wandb/offline-run-<time>-<id>/files` holds config.yaml)."""
        return Path(self._run.dir)

    def log(self, record: Mapping[str, Any], step: int) -> None:
        self._run.log({**numeric(record), STEP_KEY: step})

    def samples(self, rows: Sequence[Mapping[str, Any]], step: int) -> None:
        """The step's sampled completions as a `wandb.Table` under the key `samples`."""
        import wandb

        from exgrpo.reporting.samples import FIELDS

        table = wandb.Table(columns=list(FIELDS), data=[[r[f] for f in FIELDS] for r in rows])
        self._run.log({"samples": table, STEP_KEY: step})

    def summary(self, values: Mapping[str, Any]) -> None:
        for k, v in values.items():
            if isinstance(v, int | float | str | bool):
                self._run.summary[f"final/{k}"] = v

    def close(self) -> None:
        self._run.finish()


class RayGaugeBackend:
    """`ray.util.metrics` gauges `exgrpo_<name>` (Prometheus: `ray_exgrpo_<name>`), read by deploy/grafana."""

    def __init__(self, *, prometheus_name: Any, run_id: str) -> None:
        self._name = prometheus_name
        self._run_id = run_id
        self._gauges: dict[str, Any] = {}

    def log(self, record: Mapping[str, Any], step: int) -> None:
        from ray.util.metrics import Gauge

        for key, value in {**numeric(record), STEP_KEY: float(step)}.items():
            gauge = self._gauges.get(key)
            if gauge is None:
                gauge = self._gauges[key] = Gauge(self._name(key), description=key, tag_keys=("run_id",))
                gauge.set_default_tags({"run_id": self._run_id})
            gauge.set(value)

    def summary(self, values: Mapping[str, Any]) -> None:
        pass

    def samples(self, rows: Sequence[Mapping[str, Any]], step: int) -> None:
        pass  # text has no gauge

    def close(self) -> None:
        pass


class CandidateLog(Observer):
    """Appends the driver's scored replay candidates (entropy, trace validity) to a JSONL file: the data
    behind the Figure 1 miniature (`bench.analysis.figure1`)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def on_train_start(self, *, system: Any, driver: Any) -> None:
        """A resumed or recovered run trains the steps after its checkpoint again: drop their rows (and a
        torn last line) first, so no step's candidates appear twice."""
        if not self.path.is_file():
            return
        lines = [line for line in self.path.read_text().splitlines() if line.strip()]
        kept = []
        for line in lines:
            try:
                if json.loads(line)["step"] < driver.step:
                    kept.append(line)
            except (json.JSONDecodeError, KeyError, TypeError):
                continue
        if len(kept) < len(lines):
            atomic_write_text(self.path, "".join(f"{line}\n" for line in kept))

    def on_candidates(self, *, step: int, rows: list[dict[str, Any]]) -> None:
        with self.path.open("a") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)


class MetricsLogger(Observer):
    """The run's one logger: every record goes to each backend under the same names.

    `metrics.jsonl` is always written; `backends` adds `tensorboard` and/or `wandb`; `ray_metrics`
    mirrors numeric values to Ray gauges (`exgrpo_<name>`). The run id (kept across a resume) and
    the config are recorded in `run.json` and by every backend. `from_config(run_dir, cfg)` is what
    `exgrpo.runtime.recipe.TrainingRecipe` uses; as an observer of the driver it logs every step's record.
    """

    def __init__(
        self,
        run_dir: Path,
        *,
        ray_metrics: bool = True,
        backends: Sequence[str] = ("jsonl",),
        config: dict[str, Any] | None = None,
        wandb_project: str = "exgrpo",
        wandb_mode: str = "offline",
        quiet: bool = True,
    ) -> None:
        unknown = sorted(set(backends) - set(BACKENDS))
        if unknown:
            raise ValueError(f"unknown logging backends {unknown}; choose from {list(BACKENDS)}")
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.run_id = run_identity(self.run_dir, config)["run_id"]
        self._jsonl = JsonlBackend(self.run_dir)
        self.path = self._jsonl.path
        self.backends: dict[str, Any] = {"jsonl": self._jsonl}
        try:
            if "tensorboard" in backends:
                self.backends["tensorboard"] = TensorBoardBackend(
                    self.run_dir, run_id=self.run_id, config=config
                )
            if "wandb" in backends:
                self.backends["wandb"] = WandbBackend(
                    self.run_dir,
                    run_id=self.run_id,
                    config=config,
                    project=wandb_project,
                    mode=wandb_mode,
                    quiet=quiet,
                )
            if ray_metrics:
                self.backends["ray"] = RayGaugeBackend(prometheus_name=prometheus_name, run_id=self.run_id)
        except BaseException:
            self.close()
            raise

    @classmethod
    def from_config(cls, run_dir: Path, cfg: Any) -> MetricsLogger:
        """The logger `cfg.logging` asks for (a `exgrpo.core.config.Config`)."""
        lc = cfg.logging
        return cls(
            run_dir,
            ray_metrics=lc.ray_metrics,
            backends=lc.backends,
            config=cfg.to_dict(),
            wandb_project=lc.wandb_project,
            wandb_mode=lc.wandb_mode,
            quiet=not lc.verbose,
        )

    def log(self, record: dict[str, Any]) -> None:
        step = int(record.get(STEP, 0))
        for backend in self.backends.values():
            backend.log(record, step)

    def on_step(self, *, record: dict[str, Any]) -> None:
        self.log(record)

    def on_eval(self, *, record: dict[str, Any]) -> None:
        self.log(record)  # the evaluation before the first step: a row of its own (step -1)

    def log_samples(self, rows: list[dict[str, Any]], step: int) -> None:
        """A step's sampled completions (`exgrpo.reporting.samples`) to the backends that show text."""
        for backend in self.backends.values():
            backend.samples(rows, step)

    def summary(self, values: dict[str, Any]) -> None:
        """End-of-run figures (`exgrpo.reporting.report.summary`) to the backends that keep a run summary."""
        for backend in self.backends.values():
            backend.summary(values)

    def close(self) -> None:
        for backend in list(self.backends.values())[::-1]:
            backend.close()
        self.backends = {}


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
