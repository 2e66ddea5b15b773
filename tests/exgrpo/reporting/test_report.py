"""The end-of-run report: the summary table (printed and in summary.txt/json), the phase lines, and
one self-contained report.html whose inlined plots load in headless Chromium."""

from __future__ import annotations

import html
import io
import json
import os
import re
import shutil
import subprocess
import tempfile
import time

import pytest

from exgrpo.core import metric_names as M
from exgrpo.reporting.console import Phase, Phases
from exgrpo.reporting.report import FIGURES, RunFacts, format_summary, summary, write_report

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
]


def fake_run(n: int = 12) -> tuple[list[dict], list[dict]]:
    records = []
    for step in range(n):
        records.append(
            {
                M.STEP: step,
                M.MEAN_REWARD: 0.2 + 0.03 * step,
                M.SOLVE_RATIO: 0.25 + 0.03 * step,
                M.TOKENS: 500,
                M.REPLAY_BUCKET.format(k=1): step % 3,
                M.REPLAY_BUCKET.format(k=2): step % 4,
                M.REPLAY_BUCKET.format(k=3): 1,
                M.RETIRED: step // 2,
                M.REPLAY_SIZE: 3,
                M.REPLAY_STARTED: int(step > 2),
                M.STALENESS_MEAN: 0.5,
                M.STALENESS_MAX: 1,
                M.STEP_TIME: 1.0,
                M.WAIT_TIME: 0.5,
                M.UPDATE_TIME: 0.3,
                M.SYNC_TIME: 0.05,
                M.IDLE_TIME: 0.05,
                M.WEIGHT_LOAD: 0.02,
            }
        )
    evals = [
        {M.EVAL_ACCURACY: 0.2, M.EVAL_PASS: 0.4, "eval/version": 0},
        {M.EVAL_ACCURACY: 0.35, M.EVAL_PASS: 0.6, "eval/version": n},
    ]
    return records, evals


def test_phases_announce_only_long_phases_and_time_all():
    out = io.StringIO()
    phases = Phases(announce_after_s=0.2, stream=out)
    phases.start("quick")
    phases.start("slow", "detail")
    time.sleep(0.5)
    phases.start("silent", announce=False)
    time.sleep(0.3)
    phases.end()
    lines = out.getvalue().splitlines()
    assert lines[0] == "[exgrpo] slow: detail ..." and re.fullmatch(r"\[exgrpo\] slow: 0\.\d s", lines[1])
    assert len(lines) == 2 and set(phases.times) == {"quick", "slow", "silent"}
    assert phases.times["slow"] >= 0.5 and phases.times["quick"] < 0.2


def test_summary_table_has_phase_split():
    records, evals = fake_run()
    phases = {
        Phase.BASE_MODEL: 1.0,
        Phase.RAY: 4.0,
        Phase.ACTORS: 6.0,
        Phase.TRAIN_LOOP: 15.0,
        Phase.SHUTDOWN: 1.0,
    }
    s = summary(records, evals, 30.0, phases)
    assert s["fixed_overhead_s"] == 12.0 and s["steps_s"] == 12.0 and s["eval_and_checkpoints_s"] == 3.0
    text = format_summary(s)
    assert (
        re.search(r"held-out accuracy after +0\.350", text)
        and "fixed overhead (s)" in text
        and "  Ray start-up (s)" in text
    )


def test_html_report_is_self_contained(tmp_path, capsys):
    records, evals = fake_run()
    s = write_report(
        tmp_path,
        records=records,
        evals=evals,
        wall_s=20.0,
        facts=RunFacts(
            run_id="run-abc",
            config_yaml="trainer:\n  steps: 12\n",
            phases={"Ray start-up": 3.0, "train loop": 14.0},
        ),
        plots=True,
        html_report=True,
    )
    assert "held-out accuracy after" in capsys.readouterr().out  # the table in the terminal
    assert json.loads((tmp_path / "summary.json").read_text())["steps"] == s["steps"] == 12
    page = (tmp_path / "report.html").read_text()
    images = re.findall(r'<img [^>]*src="([^"]+)"', page)
    assert len(images) == len(FIGURES) == 6
    assert all(src.startswith("data:image/png;base64,") for src in images)
    assert not re.search(r'(src|href)="(?!data:)', page) and "http" not in page.replace("http-equiv", "")
    assert "exgrpo run run-abc" in page and "steps: 12" in page and "fixed overhead" in page
    for name in FIGURES:
        assert (tmp_path / "plots" / f"{name}.png").stat().st_size > 5000


@pytest.mark.browser
@pytest.mark.skipif(
    CHROMIUM is None,
    reason="chromium is not installed (apt-get install chromium; scripts/setup-system.sh does it)",
)
def test_html_report_renders_in_chromium(tmp_path):
    records, evals = fake_run()
    write_report(
        tmp_path, records=records, evals=evals, wall_s=20.0, facts=RunFacts(run_id="r1"), plots=False,
        html_report=True,
    )  # fmt: skip
    url = (tmp_path / "report.html").as_uri()
    with tempfile.TemporaryDirectory(prefix="chromium-") as profile:
        base = [CHROMIUM, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--window-size=1300,2400"]
        dom = subprocess.run([*base, "--dump-dom", url], capture_output=True, text=True, timeout=120).stdout
        shot = tmp_path / "report.png"
        subprocess.run([*base, f"--screenshot={shot}", url], capture_output=True, timeout=120)
    # every image decoded (its onload wrote its natural width: 600 px at 6 in x 100 dpi), none failed
    loaded = re.findall(r'data-loaded="(\d+)"', dom)
    assert loaded == ["600"] * len(FIGURES), dom[:3000]
    assert 'data-failed="' not in dom and 'id="summary"' in dom
    import matplotlib.image

    pixels = matplotlib.image.imread(shot)[..., :3]
    assert pixels.shape[:2] == (2400, 1300)
    coloured = ((pixels.max(axis=-1) - pixels.min(axis=-1)) > 0.2).mean()  # plot lines and fills, not text
    assert coloured > 0.005, coloured


def test_heldout_gain_is_the_paired_mean_with_its_standard_error():
    from exgrpo.reporting.report import heldout_gain

    # per-question differences d = [0.5, 0, 0, 0.75]: mean 0.3125; sample variance
    # (0.1875^2 + 2 * 0.3125^2 + 0.4375^2) / 3 = 0.140625; s.e. = sqrt(0.140625 / 4) = 0.1875
    evals = [
        {"per_question": [0, 0.5, 1, 0.25], "sources": ["id", "id", "ood", "ood"]},
        {"per_question": [0.5, 0.5, 1, 1], "sources": ["id", "id", "ood", "ood"]},
    ]
    g = heldout_gain(evals)
    assert g["eval_gain"] == pytest.approx(0.3125) and g["eval_gain_se"] == pytest.approx(0.1875)
    assert g["gain_by_source"]["id"] == pytest.approx(
        (0.25, 0.25)
    )  # d = [0.5, 0]: s.e. = 0.5 / sqrt(2) / sqrt(2)
    assert heldout_gain(evals[:1]) == {}  # one evaluation: no gain
    one = [dict(e, sources=["math"] * 4) for e in evals]  # one source: its gain is the total, not repeated
    assert "gain_by_source" not in heldout_gain(one) and "  gain math" not in format_summary(
        summary(fake_run()[0], [dict(fake_run()[1][i], **one[i]) for i in (0, 1)], 30.0)
    )


NASTY = '<script>document.title="pwned"</script> & <b>1</b> \\boxed{7}'


def write_samples(run_dir, steps=(0, 5, 10, 15)) -> None:
    rows = [
        {"step": s, "qid": f"q{s}-{i}", "prompt": f"What is 3+{s}?", "completion": NASTY if i == 0 else f"fresh {s}",
         "reward": float(i == 0), "bucket": "1/4", "origin": "replayed" if i == 0 else "fresh",
         "policy_version": s}
        for s in steps
        for i in range(2)
    ]  # fmt: skip
    (run_dir / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_report_names_heldout_figures_and_shows_the_last_sampled_steps_escaped(tmp_path, capsys):
    records, evals = fake_run()
    write_samples(tmp_path)
    before = {
        M.STEP: -1,
        M.EVAL_ACCURACY: 0.2,
        M.EVAL_PASS: 0.4,
        M.EVAL_VERSION: 0,
    }  # metrics.jsonl's own row
    s = write_report(
        tmp_path, records=[before, *records], evals=evals, wall_s=20.0,
        facts=RunFacts(eval_temperature=0.6, eval_samples=4), plots=False, html_report=True,
    )  # fmt: skip
    out = capsys.readouterr().out
    assert s["steps"] == 12 and s["tokens"] == 12 * 500  # the evaluation's row is not a step
    assert re.search(r"held-out accuracy before \(Avg@4, T 0\.6, n 4\) +0\.200\n", out)
    assert re.search(r"held-out accuracy after \(Avg@4, T 0\.6, n 4\) +0\.350\n", out)
    assert (s["eval_temperature"], s["eval_samples"]) == (0.6, 4)
    page = (tmp_path / "report.html").read_text()
    table = page[page.index('<table id="samples">') :]
    assert re.findall(r'<td class="step">(\d+)</td>', table) == ["15", "15", "10", "10", "5", "5"]  # last 3
    assert "<script>" not in page and "&lt;script&gt;document.title=&quot;pwned&quot;&lt;/script&gt;" in table
    assert "held-out accuracy after (Avg@4, T 0.6, n 4)" in page


@pytest.mark.browser
@pytest.mark.skipif(
    CHROMIUM is None,
    reason="chromium is not installed (apt-get install chromium; scripts/setup-system.sh does it)",
)
def test_samples_table_renders_in_chromium(tmp_path):
    records, evals = fake_run()
    write_samples(tmp_path)
    write_report(
        tmp_path, records=records, evals=evals, wall_s=20.0,
        facts=RunFacts(run_id="r1", eval_temperature=1.0, eval_samples=2), plots=False, html_report=True,
    )  # fmt: skip
    url = (tmp_path / "report.html").as_uri()
    with tempfile.TemporaryDirectory(prefix="chromium-") as profile:
        base = [CHROMIUM, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--window-size=1300,2400"]
        dom = subprocess.run([*base, "--dump-dom", url], capture_output=True, text=True, timeout=120).stdout
        shot = tmp_path / "samples.png"
        subprocess.run([*base, f"--screenshot={shot}", url], capture_output=True, timeout=120)
    # the browser parsed the table and the completion is text in its cell, not a script that ran
    assert "<title>exgrpo run r1</title>" in dom, dom[:2000]
    cells = re.findall(r'<td class="completion">(.*?)</td>', dom, flags=re.S)
    assert len(cells) == 6 and cells[0] == html.escape(NASTY, quote=False), cells[:2]
    assert re.findall(r'<td class="origin">(\w+)</td>', dom)[:2] == ["replayed", "fresh"]
    keep = os.environ.get("EXGRPO_KEEP_SCREENSHOT")  # to look at it: EXGRPO_KEEP_SCREENSHOT=/tmp/x.png
    if keep:
        shutil.copy(shot, keep)
    import matplotlib.image

    pixels = matplotlib.image.imread(shot)[..., :3]
    assert pixels.shape[:2] == (2400, 1300)
    # the table sits below the figures (y ~1650-1880 px here): its text is drawn, and nothing after it
    dark = pixels.min(axis=-1) < 0.3
    assert dark[1600:2000].mean() > 0.002 and dark[2000:].mean() < 1e-4, (
        dark[1600:2000].mean(),
        dark[2000:].mean(),
    )


def test_progress_bar_names_the_heldout_figure_with_t_and_n(capsys):
    from exgrpo.reporting.console import Progress

    bar = Progress(total=2, eval_key="eval(T 0.6, n 4)")
    bar.on_step(record={M.STEP: 0, M.EVAL_ACCURACY: 0.25})
    bar.close()
    assert "eval(T 0.6, n 4)=0.250" in capsys.readouterr().err


def test_reward_failures_reach_the_summary_the_report_and_the_bar(tmp_path, capsys):
    """A reward that raised on a third of the rollouts: before, only metrics.jsonl counted it; the summary,
    report.html and the bar said nothing and the run looked fine."""
    from exgrpo.reporting.console import Progress

    records, evals = fake_run(3)
    for r in records:
        r.update({M.ROLLOUTS: 64, M.REWARD_FAILURES: 21, M.REWARD_FAILURE_SHARE: 21 / 64})
    notes = {"raised": "ZeroDivisionError: division by zero (qid q7)"}
    s = write_report(tmp_path, records=records, evals=evals, wall_s=5.0,
                     facts=RunFacts(reward_failure_notes=notes, custom_reward=True), plots=False,
                     html_report=True)  # fmt: skip
    out = capsys.readouterr().out
    assert re.search(r"reward failures +63 of 192 rollouts \(32\.8%\)", out)
    assert re.search(r"first raised +ZeroDivisionError: division by zero \(qid q7\)", out)
    assert out.splitlines()[-1].startswith(
        "WARNING: the reward failed on 63 of 192 rollouts (32.8%, over 1%)"
    )
    assert "held-out mean reward after" in out and "held-out accuracy" not in out  # a custom reward's mean
    assert s["reward_failures"] == 63 and s["reward_failure_notes"] == notes
    page = (tmp_path / "report.html").read_text()
    assert '<p class="warning">WARNING: the reward failed on 63 of 192' in page and "(qid q7)" in page
    quiet = summary(fake_run(3)[0], evals, 5.0)  # no failures: a row that says 0, no warning
    assert "reward failures" in format_summary(quiet) and "WARNING" not in format_summary(quiet)

    bar = Progress(total=3, enabled=True)
    bar.update(records[0])
    assert bar._bar is not None and "reward_fail=21 (33%)" in str(bar._bar)
    bar.close()


def test_a_run_stopped_before_its_last_evaluation_has_no_after_figure():
    """Ctrl-C before the last step: one evaluation (before the first step); the summary must not show it again
    as the figure after training."""
    records, evals = fake_run(4)
    s = summary(records, evals[:1], 5.0)
    assert s["eval_accuracy_before"] == 0.2 and s["eval_accuracy_after"] is None
    assert re.search(r"held-out accuracy after +None", format_summary(s))


def test_prompts_skipped_as_too_long_are_counted_in_the_summary():
    records, evals = fake_run(2)
    text = format_summary(summary(records, evals, 5.0, long_prompts_skipped=3))
    assert re.search(r"prompts skipped as too long +3", text)
    assert "too long" not in format_summary(summary(records, evals, 5.0))


def test_the_plots_name_the_held_out_figure_as_the_summary_does(tmp_path, capsys):
    """A custom reward: the summary said "held-out mean reward" while report.html's plots said "held-out
    accuracy"; one name now, the summary's (a 0 / 1 reward keeps "accuracy" in both)."""
    records, evals = fake_run(3)
    write_report(tmp_path, records=records, evals=evals, wall_s=5.0, facts=RunFacts(custom_reward=True),
                 plots=False, html_report=True)  # fmt: skip
    page = (tmp_path / "report.html").read_text()
    assert "held-out accuracy" not in page.lower() and page.count("held-out mean reward") >= 3
    math_dir = tmp_path / "math"
    math_dir.mkdir()
    write_report(math_dir, records=records, evals=evals, wall_s=5.0, plots=False, html_report=True)
    page = (math_dir / "report.html").read_text()
    assert "held-out mean reward" not in page and "Held-out accuracy" in page
    assert "Pass@n: share of questions with a sample of reward &gt; 0.5" in page  # its one meaning, said
    capsys.readouterr()
