"""A Ray start-up failure (e.g. "The current node timed out during startup" on a loaded machine) is one readable
line with the cause and what to try, exit 2, no traceback, and no run directory left behind, through the
command line's own error path. Before: a 30-line traceback and exit 1."""

from __future__ import annotations

import pytest
import ray

from exgrpo import run

TIMED_OUT = (
    "The current node timed out during startup. This could happen because some of the raylet failed to "
    "startup or the GCS has become overloaded."
)


@pytest.fixture(autouse=True)
def _local(monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.delenv("EXGRPO_SKIP_RESOURCE_CHECK", raising=False)


def test_a_slow_ray_start_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys):
    def slow_start(*args, **kwargs):
        raise Exception(TIMED_OUT)  # what ray._private.node raises after 30 s

    monkeypatch.setattr(ray, "init", slow_start)
    run_dir = tmp_path / "run"
    code = run.main(["--config", "tiny-cpu", f"logging.run_dir={run_dir}", "logging.progress=false"])
    err = capsys.readouterr().err
    assert code == 2, err[-2000:]
    line = next(x for x in err.splitlines() if x.startswith("error:"))
    assert "Ray could not start a local cluster" in line and "timed out during startup" in line
    assert "run the command again" in line  # what to try
    assert "Traceback" not in err
    assert not run_dir.exists()  # a refused start leaves no run directory


def test_an_unreachable_ray_address_names_it(tmp_path, monkeypatch, capsys):
    from exgrpo.core.config_files import load_config
    from exgrpo.runtime.env import RayStartError, init_ray

    def refused(*args, **kwargs):
        raise ConnectionError("Could not find any running Ray instance")

    monkeypatch.setattr(ray, "init", refused)
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.9:6379")
    with pytest.raises(
        RayStartError, match=r"could not attach to the Ray cluster at RAY_ADDRESS=10\.0\.0\.9:6379"
    ):
        init_ray(load_config("tiny-cpu"))
