"""Monitoring a live run as a user would: `python -m exgrpo.run --dashboard` on the tiny config.

- Prometheus (Debian's `prometheus`) scrapes the run through the shipped scrape config
  (deploy/prometheus/prometheus.yml; its file_sd list points at the port the run printed) and is
  queried over its HTTP API: every series of the Grafana dashboard exists, and every panel query
  and template variable of deploy/grafana/exgrpo_grafana_dashboard.json returns data.
- Headless Chromium (Debian's `chromium`) loads the run's Ray dashboard: after its JavaScript ran,
  the Actors page lists the named exgrpo actors and the Jobs page lists the `exgrpo.run` driver;
  the dashboard's REST API reports those actors ALIVE; a screenshot of the Actors page is taken.

Both skip with the reason when their binary is absent (`scripts/setup-system.sh` installs them; CI does).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml

from exgrpo.transport import ranks

ROOT = Path(__file__).resolve().parents[2]
PROMETHEUS = shutil.which("prometheus")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
ACTORS = [
    "exgrpo-sampler-0",
    "exgrpo-sampler-1",
    "exgrpo-replay-0",
    "exgrpo-replay-1",
    "exgrpo-learner-0",
    "exgrpo-controller",
]
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

pytestmark = [pytest.mark.integration]


def free_port() -> int:
    return ranks.free_port("127.0.0.1")


def get_json(url: str, timeout: float = 10.0):
    with urllib.request.urlopen(url, timeout=timeout) as r:  # noqa: S310 (127.0.0.1 only)
        return json.loads(r.read())


# ------------------------------------------------------------------------------ a finished run's outputs
# It runs before the live run's tests (file order): the live run trains until the module ends, and would share
# the cores with this run.
def test_finished_run_writes_every_logger_and_a_quiet_terminal(tmp_path):
    """A short CLI run with all backends: same names in metrics.jsonl, TensorBoard and the offline W&B
    run; report.html; the phase lines and the summary's overhead split; no per-actor progress bars."""
    run = tmp_path / "run"
    cmd = [
        sys.executable,
        "-m",
        "exgrpo.run",
        "--config",
        "tiny-cpu",
        "trainer.steps=3",
        "logging.backends=[tensorboard,wandb]",
        f"logging.run_dir={run}",
    ]
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "WANDB_MODE": "offline"}
    env.pop("RAY_ADDRESS", None)
    out = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=600, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    terminal = out.stdout + out.stderr
    for noise in ("Loading weights", "Writing model shards"):
        assert noise not in terminal, terminal[-3000:]
    assert "fixed overhead (s)" in out.stdout and "held-out accuracy after" in out.stdout
    lines = [r for r in (run / "metrics.jsonl").read_text().splitlines() if r]
    keys = {
        k
        for line in lines
        for k, v in json.loads(line).items()
        if k != "step" and isinstance(v, int | float) and not isinstance(v, bool)
    }
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run / "tensorboard"))
    acc.Reload()
    assert keys <= set(acc.Tags()["scalars"]), keys - set(acc.Tags()["scalars"])
    run_id = json.loads((run / "run.json").read_text())["run_id"]
    assert list((run / "wandb").glob(f"offline-run-*-{run_id}/run-{run_id}.wandb"))
    page = (run / "report.html").read_text()
    assert page.count('src="data:image/png;base64,') == 6 and run_id in page
    summary = json.loads((run / "summary.json").read_text())
    assert {"Ray start-up", "actor start-up", "train loop"} <= set(summary["phases_s"])
    print(f"\nreport.html {len(page) / 1024:.0f} KiB; phases {summary['phases_s']}")


@pytest.fixture(scope="module")
def live_run(tmp_path_factory):
    """A tiny run with the dashboard on, long enough to be watched; stopped with Ctrl-C afterwards."""
    tmp = tmp_path_factory.mktemp("live")
    log = (tmp / "stderr.txt").open("w")
    cmd = [
        sys.executable,
        "-m",
        "exgrpo.run",
        "--dashboard",
        "--config",
        "tiny-cpu",
        "trainer.steps=5000",
        "trainer.eval_every=2",
        "trainer.checkpoint_every=0",
        "logging.progress=true",
        f"logging.dashboard_port={free_port()}",
        f"logging.run_dir={tmp / 'run'}",
    ]
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.Popen(
        cmd, cwd=tmp, stdout=subprocess.DEVNULL, stderr=log, env=env, start_new_session=True
    )
    info: dict = {"proc": proc, "stderr": tmp / "stderr.txt", "run_dir": tmp / "run"}
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            text = info["stderr"].read_text()
            url = re.search(r"Ray dashboard: (http://\S+)", text)
            port = re.search(r"Prometheus target: 127\.0\.0\.1:(\d+)", text)
            metrics = info["run_dir"] / "metrics.jsonl"
            steps = len(metrics.read_text().splitlines()) if metrics.exists() else 0
            if url and port and steps >= 3:  # an evaluation (step 1) and later gauges are set
                info.update(url=url.group(1).rstrip("/"), metrics_port=int(port.group(1)))
                break
            assert proc.poll() is None, f"the run exited early:\n{text[-3000:]}"
            time.sleep(0.25)
        else:
            pytest.fail(f"no dashboard URL / steps within 300 s:\n{info['stderr'].read_text()[-3000:]}")
        yield info
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: the run shuts its actors and cluster down
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        log.close()


def test_dashboard_url_is_local(live_run):
    assert live_run["url"].startswith("http://127.0.0.1:")
    assert get_json(f"{live_run['url']}/api/version")["ray_version"]


# ------------------------------------------------------------------------------------------ Prometheus
def dashboard_json() -> dict:
    return json.loads((ROOT / "deploy" / "grafana" / "exgrpo_grafana_dashboard.json").read_text())


def concrete(expr: str) -> str:
    """A panel query with Grafana's template variables set to 'All'."""
    return expr.replace('"$SessionName"', '".+"').replace('"$RunId"', '".+"')


@pytest.mark.prometheus
@pytest.mark.skipif(
    PROMETHEUS is None,
    reason="the prometheus binary is not installed "
    "(apt-get install prometheus; scripts/setup-system.sh does it)",
)
def test_prometheus_scrapes_live_run_and_every_panel_has_data(live_run, tmp_path):
    shipped = ROOT / "deploy" / "prometheus" / "prometheus.yml"
    check = subprocess.run(
        [shutil.which("promtool") or "promtool", "check", "config", str(shipped)],
        capture_output=True,
        text=True,
    )
    assert check.returncode == 0, check.stdout + check.stderr
    config = yaml.safe_load(shipped.read_text())
    config["global"]["scrape_interval"] = "1s"
    sd = tmp_path / "targets.json"  # the format of Ray's prom_metrics_service_discovery.json
    sd.write_text(
        json.dumps([{"labels": {"job": "ray"}, "targets": [f"127.0.0.1:{live_run['metrics_port']}"]}])
    )
    (job,) = config["scrape_configs"]
    job["file_sd_configs"][0]["files"] = [str(sd)]
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    api = f"http://127.0.0.1:{port}/api/v1"
    prom = subprocess.Popen(
        [
            PROMETHEUS,
            f"--config.file={tmp_path / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=(tmp_path / "prometheus.log").open("w"),
    )
    try:
        panels = dashboard_json()["panels"]
        wanted = {m for p in panels for t in p["targets"] for m in re.findall(r"ray_exgrpo_\w+", t["expr"])}
        wanted = {m for m in wanted if not m.endswith("_bucket_")}
        names: set[str] = set()
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            try:
                result = get_json(
                    f"{api}/query?" + urllib.parse.urlencode({"query": '{__name__=~"ray_exgrpo_.+"}'})
                )
                names = {r["metric"]["__name__"] for r in result["data"]["result"]}
            except OSError:
                pass
            if wanted <= names and any("bucket" in n for n in names):
                break
            time.sleep(0.5)
        log = (tmp_path / "prometheus.log").read_text()[-2000:]
        assert wanted <= names, f"missing series {sorted(wanted - names)}; prometheus log:\n{log}"
        print(f"\n{len(names)} ray_exgrpo_ series scraped: {' '.join(sorted(names))}")
        targets = get_json(f"{api}/targets")["data"]["activeTargets"]
        assert [t["health"] for t in targets] == ["up"], targets
        labels = get_json(
            f"{api}/query?" + urllib.parse.urlencode({"query": "ray_exgrpo_system_policy_version"})
        )
        metric = labels["data"]["result"][0]["metric"]
        run_id = json.loads((live_run["run_dir"] / "run.json").read_text())["run_id"]
        assert metric["run_id"] == run_id and metric["SessionName"], metric
        for p in panels:
            for t in p["targets"]:
                out = get_json(f"{api}/query?" + urllib.parse.urlencode({"query": concrete(t["expr"])}))
                assert out["status"] == "success" and out["data"]["result"], (p["title"], t["expr"], out)
        for var in dashboard_json()["templating"]["list"][1:]:
            label, match = re.fullmatch(
                r"label_values\((.+), (\w+)\)", concrete(var["query"]["query"])
            ).group(2, 1)
            values = get_json(f"{api}/label/{label}/values?" + urllib.parse.urlencode({"match[]": match}))[
                "data"
            ]
            assert values, var["name"]
    finally:
        prom.terminate()
        prom.wait(timeout=30)


# ------------------------------------------------------------------------------------------- browser
def chromium(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    with tempfile.TemporaryDirectory(prefix="chromium-") as profile:
        return subprocess.run(
            [CHROMIUM, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
        )


@pytest.mark.browser
@pytest.mark.skipif(
    CHROMIUM is None,
    reason="chromium is not installed (apt-get install chromium; scripts/setup-system.sh does it)",
)
def test_dashboard_pages_list_the_named_actors(live_run, tmp_path):
    url = live_run["url"]
    actors = get_json(f"{url}/api/v0/actors?limit=1000&detail=1")["data"]["result"]["result"]
    alive = {a["name"] for a in actors if a.get("state") == "ALIVE"}
    assert set(ACTORS) <= alive, sorted(alive)

    def page(fragment: str, *names: str) -> str:
        dom = ""
        for _ in range(3):  # the single-page app fetches its tables after load; retry on a slow machine
            out = chromium("--virtual-time-budget=20000", "--dump-dom", f"{url}/#/{fragment}")
            dom = out.stdout
            if all(n in dom for n in names):
                break
        return dom

    dom = page("actors", *ACTORS)
    missing = [n for n in ACTORS if n not in dom]
    assert not missing, f"Actors page lacks {missing}:\n{dom[-2000:]}"
    dom = page("jobs", "exgrpo.run")
    assert "exgrpo.run" in dom, dom[-2000:]  # the driver job's entrypoint
    shot = tmp_path / "actors.png"
    chromium(
        "--window-size=1400,900", "--virtual-time-budget=20000", f"--screenshot={shot}", f"{url}/#/actors"
    )
    assert shot.stat().st_size > 20_000
    keep = os.environ.get("EXGRPO_SCREENSHOTS")  # a folder to keep the screenshot in, for a person to look at
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, Path(keep) / "dashboard-actors.png")


# ------------------------------------------------------------------------------------ shipped files
def test_shipped_dashboard_is_the_generated_one_and_runtime_env_matches_pyproject():
    """deploy/grafana's JSON is what build_dashboard.py makes from the metric constants; deploy/runtime_env.yaml
    is a valid Ray runtime env that pip-installs pyproject's dependencies (ray itself comes with the node)."""
    import importlib.util

    from ray.runtime_env import RuntimeEnv

    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11

    spec = importlib.util.spec_from_file_location(
        "build_dashboard", ROOT / "deploy" / "grafana" / "build_dashboard.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.dashboard() == dashboard_json(), "rerun: python deploy/grafana/build_dashboard.py"
    env = yaml.safe_load((ROOT / "deploy" / "runtime_env.yaml").read_text())
    RuntimeEnv(**env)  # validates
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    names = {re.split(r"[\[<>=!~ ]", d)[0] for d in deps} - {"ray"}
    shipped = {re.split(r"[\[<>=!~ ]", p)[0] for p in env["pip"]["packages"]}
    assert shipped == names, shipped ^ names
