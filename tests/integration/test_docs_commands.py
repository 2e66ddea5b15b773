"""The commands docs/operating.md's cluster block and the config headers print, checked so the docs cannot drift from the code.

Fast: every printed command parses: its `ray` subcommand and flags exist (Ray's own click commands), each
`python -m exgrpo.run ...` loads its config and overrides (`--print-config` in place of `--dry-run`), and a
`--working-dir` or `--config` it names exists. Slow: the cluster block of docs/operating.md runs as written, with its own
ports beside whatever other Ray cluster this machine runs (tiny-cpu end to end through `ray job submit`), and
every GPU recipe's `--dry-run` command runs against the cluster the block started.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = sorted((ROOT / "configs").glob("*.yaml"))
LABELS = (
    "Launch:",
    "GRPO:",
    "Cluster:",
    "vLLM:",
    "Sweep:",
    "Check the placement first:",
    "Cold start:",
    "From it:",
)


def readme_cluster_block() -> list[str]:
    """The cluster block of docs/operating.md ("On a Ray cluster"), where the README points."""
    text = (ROOT / "docs" / "operating.md").read_text()
    section = text[text.index("## On a Ray cluster") :]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1)  # type: ignore[union-attr]
    return [line for line in block.splitlines() if line.strip()]


def header_commands(path: Path) -> list[str]:
    """The commands a config's header prints (after a label, or indented under `Launch ...:`)."""
    lines = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        lines.append(line[1:].strip() if not line.startswith("#   ") else line[1:])
    commands: list[str] = []
    for i, line in enumerate(lines):
        text = next((line.split(label, 1)[1].strip() for label in LABELS if label in line), None)
        if text is None and line.startswith("   ") and line.strip().split()[0] in ("ray", "python"):
            text = line.strip()
        if text is None or (commands and any(c.endswith(text) for c in commands)):
            continue
        j = i
        while text.endswith("\\"):
            j += 1
            text = text[:-1].rstrip() + " " + lines[j].strip()
        commands.append(text)
    return commands


def all_printed() -> list[tuple[str, str]]:
    out = [("README", c) for c in readme_cluster_block()]
    for path in CONFIGS:
        out += [(path.name, c) for c in header_commands(path)]
    return out


def _strip_comment(command: str) -> list[str]:
    words = shlex.split(command, comments=True)
    while words and re.fullmatch(r"[A-Z_]+=\S*", words[0]):  # VAR=value prefixes
        words = words[1:]
    return words


def check_ray(words: list[str]) -> None:
    from ray.scripts.scripts import cli

    cmd, i = cli, 1
    while hasattr(cmd, "commands") and i < len(words) and words[i] in cmd.commands:
        cmd, i = cmd.commands[words[i]], i + 1
    assert cmd is not cli, words
    known = {opt for p in cmd.params for opt in (*p.opts, *p.secondary_opts)}
    rest = words[i:]
    if "--" in rest:  # ray job submit ... -- ENTRYPOINT
        rest, entry = rest[: rest.index("--")], rest[rest.index("--") + 1 :]
        check_python(entry)
    for w in rest:
        if w.startswith("--"):
            assert w.split("=")[0] in known, f"ray {cmd.name}: no option {w}"
    if "--working-dir" in rest:
        assert (ROOT / rest[rest.index("--working-dir") + 1]).is_dir()


def check_python(words: list[str]) -> None:
    import importlib.util

    assert words[:2] == ["python", "-m"], words
    module = words[2]
    assert importlib.util.find_spec(module) is not None, module
    if module == "exgrpo.cold_start":  # its options parse and its config and overrides load
        from exgrpo.cold_start import _parser
        from exgrpo.core.config_files import load_config

        parsed = _parser().parse_intermixed_args(words[3:])
        assert parsed.config is None or (ROOT / parsed.config).is_file(), parsed.config
        load_config(parsed.config, parsed.overrides)
        return
    if module != "exgrpo.run":
        return
    args = [w for w in words[3:] if w != "--dry-run"] + ["--print-config"]
    config = args[args.index("--config") + 1] if "--config" in args else None
    assert config is None or "/" not in config or (ROOT / config).is_file(), config  # else a packaged name
    from exgrpo.run import main

    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        assert main(args) == 0, (words, err.getvalue())


@pytest.mark.parametrize("where,command", all_printed(), ids=lambda x: x if len(x) < 40 else x[:40])
def test_every_printed_command_parses(where, command, monkeypatch):
    monkeypatch.chdir(ROOT)
    words = _strip_comment(command)
    if not words or words[0] in ("./scripts/setup.sh", "export", "HEAD_PID=$!", "until", "kill"):
        return  # shell plumbing (the slow test runs it)
    if words[0] == "ray":
        check_ray(words)
    else:
        check_python(words)


def test_the_readme_block_uses_its_own_ports_and_stops_only_its_cluster():
    block = "\n".join(readme_cluster_block())
    assert "ray stop" not in block and "kill $HEAD_PID" in block and "--block" in block
    start = next(line for line in readme_cluster_block() if line.startswith("ray start"))
    for flag in ("--port", "--dashboard-port", "--dashboard-agent-listen-port", "--ray-client-server-port"):
        assert flag in start
    gcs = re.search(r"--port (\d+)", start).group(1)  # type: ignore[union-attr]
    dashboard = re.search(r"--dashboard-port (\d+)", start).group(1)  # type: ignore[union-attr]
    assert f"RAY_ADDRESS=127.0.0.1:{gcs} python -m exgrpo.run" in block  # the dry run checks this cluster
    assert block.count(f"http://127.0.0.1:{dashboard}") == 2
    for path in CONFIGS:  # the local configs' Cluster: lines point at docs/operating.md's cluster
        for c in header_commands(path):
            if "127.0.0.1" in c and path.name != "paper-regime.yaml":
                assert f"http://127.0.0.1:{dashboard}" in c, (path.name, c)


def gpu_dry_runs(gcs: str) -> list[str]:
    out = []
    for path in CONFIGS:
        for c in header_commands(path):
            if "--dry-run" in c and c.startswith("RAY_ADDRESS="):
                # the recipes read /data/openr1-math-46k.parquet on their cluster; here the example file of
                # the same (OpenR1) layout stands in, so the dry run gets past the data to the placement
                c = re.sub(r"^RAY_ADDRESS=\S+", f"RAY_ADDRESS=127.0.0.1:{gcs}", c)
                out.append(f"{c} data.train=docs/data/openr1.parquet")
    return out


@pytest.mark.slow
@pytest.mark.integration
def test_the_readme_cluster_block_runs_as_written(tmp_path):
    lines = readme_cluster_block()
    start = next(line for line in lines if line.startswith("ray start"))
    gcs = re.search(r"--port (\d+)", start).group(1)  # type: ignore[union-attr]
    dry_runs = gpu_dry_runs(gcs)
    assert len(dry_runs) == 3
    venv = f'export PATH="{Path(sys.executable).parent}:$PATH"'  # the venv: what setup.sh + activate give
    script = ["set -u", venv]
    for line in lines:
        if line.startswith("./scripts/setup.sh"):
            continue
        if line.startswith("kill $HEAD_PID"):
            for c in dry_runs:
                script += [f"echo '### {c}'", f'{c}; echo "### rc=$?"']
        script.append(f"echo '### {line}'")
        script.append(line)
    env = {**os.environ, "EXGRPO_RUNS_DIR": str(tmp_path / "runs")}
    env.pop("RAY_ADDRESS", None)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    out = subprocess.run(
        ["bash", "-c", "\n".join(script)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,  # one stream, in order: each command's output follows its ### line
        text=True,
        timeout=1500,
    )
    text = out.stdout
    (tmp_path / "block.log").write_text(text)
    submitted = text.split("### ray job submit", 1)[1].split("### ray job list", 1)[0]
    assert re.search(r"Job 'raysubmit_\w+' succeeded", submitted), submitted[-5000:]
    runs = list((tmp_path / "runs").iterdir())
    assert len(runs) == 1 and (runs[0] / "final" / "model.safetensors").is_file(), submitted[-3000:]
    assert submitted.count(f"run directory {runs[0]}") == 2  # printed at start and at the end
    assert (
        "RUNNING" in text.split("### ray job list", 1)[1]
        or "SUCCEEDED" in text.split("### ray job list", 1)[1]
    )
    for c in (
        dry_runs
    ):  # on this CPU cluster only the resources are missing: config, model id, data and memory plan pass
        part, rc = text.split(f"### {c}", 1)[1].split("### rc=", 1)
        assert rc.startswith("2"), part[-2000:]
        assert "plan: fits" in part and "the run cannot be placed on the Ray cluster at 127.0.0.1:" in part, (
            part
        )
        assert "GPUs" in part, part[-2000:]
    stopped = text.split("### kill $HEAD_PID", 1)[1]
    assert "Traceback" not in stopped
    with socket.socket() as sock:  # that cluster is gone (and only it: the block never runs `ray stop`)
        assert sock.connect_ex(("127.0.0.1", int(gcs))) != 0
