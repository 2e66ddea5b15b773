"""The end of a run: the summary table, the plots and report.html (the terminal during a run: `console.py`).

- `write_report`: `summary.json`, `summary.txt` (also printed), `plots/*.png` (`logging.plots`, drawn by
  `exgrpo.reporting.plots`) and one self-contained `report.html` (`logging.report`: the plots inlined as
  base64 PNG and the last sampled completions of `samples.jsonl`, no external file or network access);
  what it says about the run besides its metrics (id, config, phases, how it evaluated) is a `RunFacts`.

Every held-out figure says how it was measured (`measured`): Avg@n at the evaluation's temperature T
with n samples per question, so a reader never compares figures measured differently.
"""

from __future__ import annotations

import base64
import html
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from exgrpo.core import metric_names as M
from exgrpo.core.config_display import shown_text
from exgrpo.core.fileio import atomic_write_text
from exgrpo.reporting.console import Phase
from exgrpo.reporting.plots import FIGURES as FIGURES  # the figure names, for its readers
from exgrpo.reporting.plots import HELDOUT, TIME_SPLIT, figure_titles, render_figures
from exgrpo.reporting.samples import last_steps, read_samples

# Start-up and tear-down phases of the training recipe: the fixed overhead of a run (all but the loop).
FIXED_PHASES = tuple(p for p in Phase if p is not Phase.TRAIN_LOOP)
SAMPLE_STEPS = 3  # report.html shows the completions of the last this many sampled steps
# The summary warns when more than this share of the run's rollouts lost their reward (raised, returned no
# number, timed out: each scored 0). 1%: past it, the failures move the mean reward and the buckets visibly.
REWARD_FAILURE_WARN = 0.01


def measured(temperature: float | None, n: int | None) -> str:
    """How a held-out figure was measured, `Avg@4, T 1.0, n 4` ("" when the caller did not say)."""
    return "" if temperature is None or n is None else f"Avg@{n}, T {temperature}, n {n}"


def summary(
    records: Sequence[dict[str, Any]],
    evals: Sequence[dict[str, float]],
    wall_s: float,
    phases: dict[str, float] | None = None,
    *,
    eval_temperature: float | None = None,
    eval_samples: int | None = None,
    reward_failure_notes: dict[str, str] | None = None,
    custom_reward: bool = False,
    long_prompts_skipped: int = 0,
) -> dict[str, Any]:
    """The run's figures; `eval_temperature` / `eval_samples`: how its held-out evaluations sampled;
    `reward_failure_notes`: the first reward failure of each kind; `custom_reward`: the reward is a user's
    `reward.fn`, so the held-out figure is a mean reward, not an accuracy; `long_prompts_skipped`: prompts left
    out as longer than `model.max_prompt_len` (`data.long_prompts=skip`)."""
    last = records[-1] if records else {}
    buckets = {k: v for k, v in last.items() if k.startswith("replay/bucket_")}

    def total(key: str) -> float:
        return float(sum(r.get(key) or 0 for r in records))

    out = {
        "steps": len(records),
        "eval_accuracy_before": evals[0][M.EVAL_ACCURACY] if evals else None,
        # one evaluation (a run stopped before its last step): there is no "after"
        "eval_accuracy_after": evals[-1][M.EVAL_ACCURACY] if len(evals) > 1 else None,
        "eval_temperature": eval_temperature,
        "eval_samples": eval_samples,
        "tokens": int(total(M.TOKENS)),
        "tokens_per_s": total(M.TOKENS) / max(total(M.STEP_TIME), 1e-9),
        "retired": last.get(M.RETIRED, 0),
        "replay_size": last.get(M.REPLAY_SIZE, 0),
        "buckets": buckets,
        "replay_started": bool(last.get(M.REPLAY_STARTED, 0)),
        "recoveries": int(
            last.get(M.RECOVERIES, 0)
        ),  # in-job restarts from a checkpoint (trainer.max_failures)
        "wall_s": wall_s,
        "time_split_s": {k: total(key) for k, key in TIME_SPLIT},
        "rollouts": int(total(M.ROLLOUTS)),
        "reward_failures": int(total(M.REWARD_FAILURES)),
        "reward_failure_share": total(M.REWARD_FAILURES) / max(total(M.ROLLOUTS), 1.0),
        "reward_failure_notes": dict(reward_failure_notes or {}),
        "heldout_name": "held-out mean reward" if custom_reward else HELDOUT,  # the plots' name too
        "long_prompts_skipped": long_prompts_skipped,  # over model.max_prompt_len (data.long_prompts=skip)
    }
    out.update(heldout_gain(evals))
    if phases:
        steps_s = total(M.STEP_TIME)
        out["phases_s"] = dict(phases)
        out["steps_s"] = steps_s
        # the loop minus its steps: held-out evaluations, checkpoints, the final save
        out["eval_and_checkpoints_s"] = max(phases.get(Phase.TRAIN_LOOP, 0.0) - steps_s, 0.0)
        out["fixed_overhead_s"] = sum(phases.get(p, 0.0) for p in FIXED_PHASES)
    return out


def heldout_gain(evals: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Held-out gain from the first to the last evaluation with its paired standard error.

    Each evaluation keeps every question's Avg@n in the same order (`per_question`), so the gain is the
    mean of per-question differences d_i and its standard error std(d, ddof=1) / sqrt(#questions);
    also per data source (e.g. ID and OOD) when the eval set mixes several (`gain_by_source`).
    """
    if len(evals) < 2 or "per_question" not in evals[0] or "per_question" not in evals[-1]:
        return {}
    first, last = evals[0]["per_question"], evals[-1]["per_question"]
    if len(first) != len(last) or len(first) < 2:
        return {}
    d = [b - a for a, b in zip(first, last, strict=True)]
    mean = sum(d) / len(d)
    se = (sum((x - mean) ** 2 for x in d) / (len(d) - 1) / len(d)) ** 0.5
    out: dict[str, Any] = {"eval_gain": mean, "eval_gain_se": se}
    sources = evals[0].get("sources")
    # one source: its gain is the total's, so it is left out (the summary would print the same line twice)
    if sources and len(sources) == len(d) and len(set(sources)) > 1:
        by: dict[str, list[float]] = {}
        for src, x in zip(sources, d, strict=True):
            by.setdefault(src, []).append(x)
        out["gain_by_source"] = {
            src: (
                sum(v) / len(v),
                (sum((x - sum(v) / len(v)) ** 2 for x in v) / max(len(v) - 1, 1) / len(v)) ** 0.5,
            )
            for src, v in by.items()
        }
    return out


def _rows(s: dict[str, Any]) -> list[tuple[str, str]]:
    def f(x: Any) -> str:
        return f"{x:.3f}" if isinstance(x, float) else str(x)

    how = measured(s.get("eval_temperature"), s.get("eval_samples"))
    at = f" ({how})" if how else ""  # after an accuracy's name
    se = f"(± s.e.; {how})" if how else "(± s.e.)"  # after a gain's name
    name = s.get("heldout_name", HELDOUT)
    rows = [
        ("steps", f"{s['steps']} of {s['steps_planned']}" if s.get("steps_planned") else s["steps"]),
        (f"{name} before{at}", f(s["eval_accuracy_before"])),
        (f"{name} after{at}", f(s["eval_accuracy_after"])),
        *(
            [(f"held-out gain {se}", f"{s['eval_gain']:+.3f} ± {s['eval_gain_se']:.3f}")]
            if "eval_gain" in s
            else []
        ),
        *[
            (f"  gain {src} {se}", f"{g:+.3f} ± {e:.3f}")
            for src, (g, e) in s.get("gain_by_source", {}).items()
        ],
        *(
            [
                (
                    "reward failures",
                    f"{s['reward_failures']} of {s['rollouts']} rollouts ({s['reward_failure_share']:.1%})",
                )
            ]
            if "reward_failures" in s
            else []
        ),
        *[(f"  first {kind}", text) for kind, text in s.get("reward_failure_notes", {}).items()],
        *(
            [("prompts skipped as too long", s["long_prompts_skipped"])]
            if s.get("long_prompts_skipped")
            else []
        ),
        ("generated tokens", s["tokens"]),
        ("tokens/s (per step time)", f(s["tokens_per_s"])),
        ("replay started", s["replay_started"]),
        ("replayable questions", s["replay_size"]),
        ("retired questions", s["retired"]),
        ("buffer per bucket", " ".join(f"{k.split('_')[-1]}:{v}" for k, v in s["buckets"].items()) or "-"),
        *([("in-job recoveries", s["recoveries"])] if s.get("recoveries") else []),
        ("wall time (s)", f(s["wall_s"]) + _starts(s.get("wall_s_starts") or [])),
    ]
    rows += [(f"  time in {k} (s)", f(v)) for k, v in s["time_split_s"].items()]
    if "phases_s" in s:
        rows.append(("fixed overhead (s)", f"{s['fixed_overhead_s']:.1f}"))
        rows += [(f"  {k} (s)", f"{v:.1f}") for k, v in s["phases_s"].items() if k in FIXED_PHASES]
        rows.append(("steps (s)", f"{s['steps_s']:.1f}"))
        rows.append(("evaluation + checkpoints (s)", f"{s['eval_and_checkpoints_s']:.1f}"))
    return [(k, str(v)) for k, v in rows]


def _starts(starts: Sequence[float]) -> str:
    """How a resumed run's wall time adds up: ` (2 starts: 100.0 + 60.0)` ("" for one start)."""
    return f" ({len(starts)} starts: {' + '.join(f'{x:.1f}' for x in starts)})" if len(starts) > 1 else ""


def warnings(s: dict[str, Any]) -> list[str]:
    """The summary's warning lines: rewards that failed on more than `REWARD_FAILURE_WARN` of the rollouts."""
    share = s.get("reward_failure_share", 0.0)
    if share <= REWARD_FAILURE_WARN:
        return []
    return [
        f"WARNING: the reward failed on {s['reward_failures']} of {s['rollouts']} rollouts ({share:.1%}, over "
        f"{REWARD_FAILURE_WARN:.0%}); each scored 0. The 'first <kind>' rows show the first of each kind; "
        "rollout/reward_failures in metrics.jsonl counts them per step (docs/rewards.md)"
    ]


def format_summary(s: dict[str, Any]) -> str:
    rows = _rows(s)
    width = max(len(k) for k, _ in rows)
    return "\n".join([*(f"{k:<{width}}  {v}" for k, v in rows), *warnings(s)])


def run_span(run_dir: Path, *, steps: int, wall_s: float, config_yaml: str) -> dict[str, Any]:
    """The run's planned steps (`trainer.steps` of `config_yaml`) and its wall time over every start: a run
    directory whose summary.json counts fewer steps than this start ends with is a resumed run, whose earlier
    starts' times (`wall_s_starts`) are added (a start that ended without a summary is not counted)."""
    import yaml

    planned = ((yaml.safe_load(config_yaml) or {}).get("trainer") or {}).get("steps") if config_yaml else None
    earlier: list[float] = []
    try:
        prior = json.loads((run_dir / "summary.json").read_text())
        if int(prior.get("steps", steps)) < steps:
            earlier = [float(x) for x in prior.get("wall_s_starts") or [prior["wall_s"]]]
    except (OSError, ValueError, KeyError, TypeError):
        pass
    starts = [*earlier, wall_s]
    return {"steps_planned": planned, "wall_s": sum(starts), "wall_s_starts": starts}


@dataclass(frozen=True)
class RunFacts:
    """What a report says about its run besides the metrics rows (each field as `summary` reads it)."""

    run_id: str = ""  # report.html's title; "" = the run directory's name
    config_yaml: str = ""  # the run's config: report.html shows it, `run_span` reads its planned steps
    phases: dict[str, float] | None = None  # seconds per phase of the recipe (`console.Phase`)
    eval_temperature: float | None = None  # how the held-out evaluations sampled (`measured`)
    eval_samples: int | None = None
    reward_failure_notes: dict[str, str] | None = None  # the first reward failure of each kind
    custom_reward: bool = False  # a user's `reward.fn`: the held-out figure is a mean reward
    long_prompts_skipped: int = 0  # prompts left out as longer than `model.max_prompt_len`


def write_report(
    run_dir: Path,
    *,
    records: Sequence[dict[str, Any]],
    evals: Sequence[dict[str, float]],
    wall_s: float,
    facts: RunFacts | None = None,
    plots: bool = True,
    html_report: bool = False,
) -> dict[str, Any]:
    """summary.json / summary.txt (printed), `plots/*.png` if `plots`, `report.html` if `html_report`.

    `records` are metrics.jsonl's rows; the evaluation before the first step (step -1) is in `evals`, so
    only the steps' rows (step >= 0) are summed and plotted. `facts`: the rest the report says (None: none).
    """
    run_dir = Path(run_dir)
    f = facts or RunFacts()
    records = [r for r in records if r.get(M.STEP, 0) >= 0]
    s = summary(
        records,
        evals,
        wall_s,
        f.phases,
        eval_temperature=f.eval_temperature,
        eval_samples=f.eval_samples,
        reward_failure_notes=f.reward_failure_notes,
        custom_reward=f.custom_reward,
        long_prompts_skipped=f.long_prompts_skipped,
    )
    s.update(run_span(run_dir, steps=len(records), wall_s=wall_s, config_yaml=f.config_yaml))
    atomic_write_text(run_dir / "summary.json", json.dumps(s, indent=2))
    text = format_summary(s)
    atomic_write_text(run_dir / "summary.txt", text + "\n")
    print(text)
    if records and (plots or html_report):
        figures = render_figures(records, evals, heldout=s["heldout_name"])
        if plots:
            out = run_dir / "plots"
            out.mkdir(exist_ok=True)
            for name, png in figures.items():
                (out / f"{name}.png").write_bytes(png)
        if html_report:
            samples = last_steps(read_samples(run_dir / "samples.jsonl"), SAMPLE_STEPS)
            page = report_html(
                s, figures, run_id=f.run_id or run_dir.name, config_yaml=f.config_yaml, samples=samples
            )
            atomic_write_text(run_dir / "report.html", page)
    return s


_CSS = """body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1300px;color:#222}
.warning{color:#a00;font-weight:bold}
h1{font-size:1.4em}h2{font-size:1.1em;margin:0 0 .3em}table{border-collapse:collapse}
td{padding:2px 12px 2px 0;border-bottom:1px solid #eee}td:first-child{white-space:pre}
.grid{display:flex;flex-wrap:wrap;gap:16px}.fig{flex:0 0 600px}.fig p{margin:0;color:#666;font-size:.85em}
img{width:600px;height:350px;display:block}img[data-failed]{outline:2px solid red}
pre{background:#f6f6f6;padding:8px;font-size:.8em;overflow:auto}
#samples td{vertical-align:top;font-size:.85em}#samples td.prompt,#samples td.completion{white-space:pre-wrap;
font-family:monospace;max-width:420px}th{text-align:left;padding-right:12px}"""


def samples_html(samples: Sequence[dict[str, Any]]) -> str:
    """The sampled completions as a table (`id="samples"`); every cell escaped, since prompts and
    completions are model input and output, not markup."""
    if not samples:
        return ""
    esc = html.escape
    cols = ("step", "origin", "qid", "reward", "bucket", "policy_version", "prompt", "completion")
    head = "".join(f"<th>{esc(c)}</th>" for c in cols)

    def cell(value: Any) -> str:
        return f"{value:.3f}" if isinstance(value, float) else str(value)  # rewards to 3 decimals

    body = "\n".join(
        "<tr>" + "".join(f'<td class="{c}">{esc(cell(r[c]))}</td>' for c in cols) + "</tr>" for r in samples
    )
    return (
        f"<h2>Sampled completions</h2><p>the last {SAMPLE_STEPS} sampled steps of samples.jsonl "
        f"(logging.samples_every), newest first; bucket = correct rollouts of the group k/K</p>\n"
        f'<table id="samples"><tr>{head}</tr>\n{body}</table>\n'
    )


def report_html(
    s: dict[str, Any],
    figures: dict[str, bytes],
    *,
    run_id: str,
    config_yaml: str = "",
    samples: Sequence[dict[str, Any]] = (),
) -> str:
    """One self-contained page: the summary table, every figure as a base64 PNG, the sampled
    completions, the config."""
    esc = html.escape
    rows = "\n".join(f"<tr><td>{esc(k)}</td><td>{esc(v)}</td></tr>" for k, v in _rows(s))
    warned = "".join(f'<p class="warning">{esc(w)}</p>\n' for w in warnings(s))
    figs = []
    for name, png in figures.items():
        title, what = figure_titles(s.get("heldout_name", HELDOUT)).get(name, (name, ""))
        data = base64.b64encode(png).decode("ascii")
        figs.append(
            f'<div class="fig" id="fig-{esc(name)}"><h2>{esc(title)}</h2><p>{esc(what)}</p>'
            f'<img alt="{esc(title)}" src="data:image/png;base64,{data}" '
            f'onload="this.dataset.loaded=this.naturalWidth" onerror="this.dataset.failed=1"></div>'
        )
    config = f"<h2>Config</h2><pre>{esc(shown_text(config_yaml))}</pre>" if config_yaml else ""
    return (
        f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8"><title>exgrpo run {esc(run_id)}</title>'
        f"<style>{_CSS}</style></head><body>\n<h1>exgrpo run {esc(run_id)}</h1>\n"
        f'{warned}<table id="summary">{rows}</table>\n<div class="grid">{"".join(figs)}</div>\n'
        f"{samples_html(samples)}{config}\n"
        f"</body></html>\n"
    )
