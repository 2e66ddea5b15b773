"""Writes deploy/grafana/exgrpo_grafana_dashboard.json: the Grafana dashboard of the exgrpo_ metrics.

    .venv/bin/python deploy/grafana/build_dashboard.py      # after adding a metric to a panel below

Built the way Ray's own dashboards are (the JSON that Ray writes to
/tmp/ray/session_latest/metrics/grafana/dashboards/): schema 27, a hidden `datasource` variable
(`${datasource}` in every panel), a `SessionName` variable, 12x8 graph panels in two columns, a
`rayVersion`-free tag list and its own uid (`exgrpoDashboard`), so it imports beside Ray's
dashboards (same folder, same data source) without replacing one. Every series is a Ray gauge
`ray_exgrpo_<key>` (`exgrpo.core.metric_names.prometheus_name`, Ray adds the `ray_` prefix) labelled with
the run's `run_id`; `tests/integration/test_monitoring.py` runs every panel query against a
real Prometheus scraping a live run.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from exgrpo.core import metric_names as M  # noqa: E402

OUT = Path(__file__).with_name("exgrpo_grafana_dashboard.json")
FILTER = 'SessionName=~"$SessionName",run_id=~"$RunId"'


def series(key: str) -> str:
    """Prometheus name of a metric key as Ray exports it."""
    return "ray_" + M.prometheus_name(key)


def q(key: str, legend: str | None = None) -> tuple[str, str]:
    """One target: the gauge, one line per run (max over the exporting worker's labels)."""
    return f"max by (run_id) ({series(key)}{{{FILTER}}})", legend or key


# (title, description, unit, stacked, targets)
PANELS: list[tuple[str, str, str, bool, list[tuple[str, str]]]] = [
    (
        "Throughput: tokens/s",
        "Generated tokens per wall second since the previous step.",
        "short",
        False,
        [q(M.TOKENS_PER_S)],
    ),
    (
        "Throughput: groups/s",
        "Trained groups (questions x K rollouts) per wall second.",
        "short",
        False,
        [q(M.GROUPS_PER_S)],
    ),
    (
        "Reward and solve ratio",
        "Fresh rollouts' mean reward and solve ratio (drives the delayed start).",
        "percentunit",
        False,
        [q(M.MEAN_REWARD), q(M.SOLVE_RATIO), q(M.ZERO_VARIANCE_FRAC)],
    ),
    (
        "Held-out accuracy",
        "Avg@n and Pass@n of the latest held-out evaluation.",
        "percentunit",
        False,
        [q(M.EVAL_ACCURACY), q(M.EVAL_PASS)],
    ),
    (
        "Replay buckets",
        "Replayable questions per correctness bucket k/K (stacked), all shards.",
        "short",
        True,
        [
            (
                f'max by (__name__, run_id) ({{__name__=~"{series(M.REPLAY_BUCKET.format(k=0))[:-1]}[0-9]+",{FILTER}}})',
                "{{__name__}}",
            )
        ],
    ),
    (
        "Retired and replayable questions",
        "Questions solved K/K (retired for good), replayable questions and stored trajectories.",
        "short",
        False,
        [q(M.RETIRED), q(M.REPLAY_SIZE), q(M.TRAJECTORIES)],
    ),
    (
        "Batch mix",
        "Replayed and fresh groups in each step's batch; replay requests re-issued as fresh.",
        "short",
        True,
        [q(M.N_REPLAY), q(M.N_FRESH), q(M.REPLACED)],
    ),
    (
        "Staleness",
        "Training version minus sampling version over the batch (max <= async.max_staleness).",
        "short",
        False,
        [q(M.STALENESS_MEAN), q(M.STALENESS_MAX)],
    ),
    (
        "Step-time split",
        "Where the step's wall time goes (stacked): waiting for generations, entropy scoring, "
        "learner update, weight sync, the rest.",
        "s",
        True,
        [q(M.WAIT_TIME), q(M.UPDATE_TIME), q(M.SYNC_TIME), q(M.IDLE_TIME)],
    ),
    (
        "Weight sync",
        "Driver-side broadcast time and the samplers' mean weight-load time.",
        "s",
        False,
        [q(M.SYNC_TIME), q(M.WEIGHT_LOAD)],
    ),
    (
        "Learner loss and entropy",
        "ExGRPO loss, its policy-gradient part and the token entropy.",
        "short",
        False,
        [q(M.LOSS), q(M.PG_LOSS), q(M.ENTROPY)],
    ),
    (
        "Learner health",
        "Gradient norm, approximate KL, clip fraction and skipped optimiser steps.",
        "short",
        False,
        [q(M.GRAD_NORM), q(M.APPROX_KL), q(M.CLIP_FRAC), q(M.SKIPPED_STEPS)],
    ),
    ("Progress", "Steps done and the learner's policy version.", "short", False, [q(M.STEP), q(M.VERSION)]),
    (
        "Samplers",
        "Live sampler actors (python -m exgrpo.scale), samplers replaced after failures, and in-job recoveries "
        "of the whole run from a checkpoint (trainer.max_failures).",
        "short",
        False,
        [q(M.SAMPLERS), q(M.SAMPLER_RESTARTS), q(M.RECOVERIES)],
    ),
    (
        "Elastic samplers",
        "The sampler count the run aims for (the operator's, or samplers.autoscale's policy) against the samplers "
        "taking requests, the samplers lost to drained or vanished nodes (preemptions, not failures), and the share "
        "of the samplers' time held back by the staleness bound (the policy's shrink signal).",
        "short",
        False,
        [q(M.SAMPLERS_TARGET), q(M.SAMPLERS_LIVE), q(M.SAMPLER_PREEMPTIONS), q(M.SAMPLERS_BLOCKED)],
    ),
]


def variable(name: str, description: str, query: str, hide: int = 0) -> dict[str, Any]:
    """A multi-value query variable of the dashboard (`SessionName`, `RunId`), "All" selected."""
    return {
        "allValue": ".+",
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
        "datasource": "${datasource}",
        "definition": query,
        "description": description,
        "error": None,
        "hide": hide,
        "includeAll": True,
        "label": None,
        "multi": True,
        "name": name,
        "options": [],
        "query": {"query": query, "refId": "StandardVariableQuery"},
        "refresh": 2,
        "regex": "",
        "skipUrlSync": False,
        "sort": 2,
        "tagValuesQuery": "",
        "tags": [],
        "tagsQuery": "",
        "type": "query",
        "useTags": False,
    }


def panel(
    index: int, title: str, description: str, unit: str, stack: bool, targets: list[tuple[str, str]]
) -> dict[str, Any]:
    """Graph panel `index` (12x8, two columns) of one `PANELS` row, in the style of Ray's own panels."""
    return {
        "aliasColors": {},
        "bars": False,
        "dashLength": 10,
        "dashes": False,
        "datasource": "${datasource}",
        "description": description,
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "fill": 3 if stack else 0,
        "fillGradient": 0,
        "gridPos": {"h": 8, "w": 12, "x": 12 * (index % 2), "y": 8 * (index // 2)},
        "hiddenSeries": False,
        "id": index + 1,
        "legend": {
            "alignAsTable": True,
            "avg": False,
            "current": True,
            "hideEmpty": False,
            "hideZero": False,
            "max": True,
            "min": False,
            "rightSide": False,
            "show": True,
            "total": False,
            "values": True,
        },
        "lines": True,
        "linewidth": 1,
        "nullPointMode": "connected" if stack else None,
        "options": {"alertThreshold": True},
        "percentage": False,
        "pluginVersion": "7.5.17",
        "pointradius": 2,
        "points": False,
        "renderer": "flot",
        "seriesOverrides": [],
        "spaceLength": 10,
        "stack": stack,
        "steppedLine": False,
        "targets": [
            {
                "exemplar": True,
                "expr": expr,
                "interval": "",
                "legendFormat": legend,
                "queryType": "randomWalk",
                "refId": chr(ord("A") + i),
            }
            for i, (expr, legend) in enumerate(targets)
        ],
        "thresholds": [],
        "timeFrom": None,
        "timeRegions": [],
        "timeShift": None,
        "title": title,
        "tooltip": {"shared": True, "sort": 0, "value_type": "individual"},
        "type": "graph",
        "xaxis": {"buckets": None, "mode": "time", "name": None, "show": True, "values": []},
        "yaxes": [
            {
                "$$hashKey": "object:628",
                "format": unit,
                "label": "",
                "logBase": 1,
                "max": None,
                "min": "0",
                "show": True,
            },
            {
                "$$hashKey": "object:629",
                "format": "short",
                "label": None,
                "logBase": 1,
                "max": None,
                "min": None,
                "show": True,
            },
        ],
        "yaxis": {"align": False, "alignLevel": None},
    }


def dashboard() -> dict[str, Any]:
    """The whole dashboard: its variables (data source, session, run) and one panel per `PANELS` row."""
    anchor = series(M.VERSION)
    return {
        "title": "ExGRPO Dashboard",
        "uid": "exgrpoDashboard",
        "description": "ExGRPO on Ray: throughput, reward, replay buckets, staleness, step time and weight sync "
        "(exgrpo.core.metric_names, docs/metrics.md).",
        "version": 1,
        "schemaVersion": 27,
        "style": "dark",
        "editable": True,
        "graphTooltip": 1,
        "refresh": "10s",
        "time": {"from": "now-30m", "to": "now"},
        "timepicker": {},
        "timezone": "",
        "tags": ["ray", "exgrpo"],
        "links": [],
        "id": None,
        "gnetId": None,
        "fiscalYearStartMonth": 0,
        "iteration": 1667344411089,
        "annotations": {
            "list": [
                {
                    "builtIn": 1,
                    "datasource": "-- Grafana --",
                    "enable": True,
                    "hide": True,
                    "iconColor": "rgba(0, 211, 255, 1)",
                    "name": "Annotations & Alerts",
                    "type": "dashboard",
                }
            ]
        },
        "templating": {
            "list": [
                {
                    "current": {"selected": False},
                    "description": "Filter queries of a specific Prometheus type.",
                    "hide": 2,
                    "includeAll": False,
                    "multi": False,
                    "name": "datasource",
                    "options": [],
                    "query": "prometheus",
                    "refresh": 1,
                    "regex": "",
                    "skipUrlSync": False,
                    "type": "datasource",
                },
                variable(
                    "SessionName",
                    "Filter queries to specific Ray sessions.",
                    f"label_values({anchor}, SessionName)",
                ),
                variable(
                    "RunId",
                    "Filter queries to specific exgrpo runs (run.json's run_id).",
                    f'label_values({anchor}{{SessionName=~"$SessionName"}}, run_id)',
                ),
            ]
        },
        "panels": [panel(i, *p) for i, p in enumerate(PANELS)],
        "rayMeta": ["supportsGlobalFilterOverride"],
    }


def main() -> None:
    """Write `OUT` and say how many panels it has."""
    OUT.write_text(json.dumps(dashboard(), indent=4) + "\n")
    print(f"wrote {OUT.relative_to(ROOT)} ({len(PANELS)} panels)")


if __name__ == "__main__":
    main()
