"""The end-of-run report: the summary table (printed and in summary.txt/json), the phase lines, and
one self-contained report.html whose inlined plots load in headless Chromium."""

from __future__ import annotations

import io
import json
import re
import shutil
import subprocess
import tempfile
import time

import pytest

from exgrpo.core import metric_names as M
from exgrpo.reporting.console import Phase, Phases
from exgrpo.reporting.report import FIGURES, format_summary, summary, write_report

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
                M.ENTROPY_TIME: 0.1,
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
        plots=True,
        html_report=True,
        phases={"Ray start-up": 3.0, "train loop": 14.0},
        run_id="run-abc",
        config_yaml="trainer:\n  steps: 12\n",
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
        tmp_path, records=records, evals=evals, wall_s=20.0, plots=False, html_report=True, run_id="r1"
    )
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
