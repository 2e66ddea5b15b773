"""docs/gpu.md as the GPU renter's path, and the GPU configs' headers, checked against the tree.

The page's steps come in the order a renter acts; its GPU install command is the README's, names the index the
pinned CUDA torch needs, and only extras that exist; each GPU recipe's header builds the data file it trains on,
says that it has no held-out set during training and names the evaluation afterwards (options that parse);
the smoke config is the 1.5B recipe on one sampler GPU and one learner GPU with a checkpoint mid-run.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import tomllib

from exgrpo.core.config_files import load_config
from exgrpo.data.benchmarks import SOURCES
from exgrpo.evaluate import _parser

ROOT = Path(__file__).resolve().parents[2]
GPU_PAGE = ROOT / "docs" / "gpu.md"
RECIPES = ("qwen2.5-math-1.5b", "qwen2.5-math-7b", "llama3.1-8b")
STEPS = (
    "## 1. Install",
    "## 2. Build the data",
    "## 3. Dry run",
    "## 4. The GPU smoke run",
    "## 5. The full recipe",
)


def _gpu_install(text: str) -> list[str]:
    return [line for line in text.splitlines() if "constraints/gpu.txt" in line and "pip install" in line]


def _header(name: str) -> str:
    lines = (ROOT / "configs" / f"{name}.yaml").read_text().splitlines()
    return "\n".join(
        line[1:] for line in lines[: next(i for i, x in enumerate(lines) if not x.startswith("#"))]
    )


def _commands(header: str, module: str) -> list[list[str]]:
    """The `python -m MODULE ...` commands of a header, continuation lines joined."""
    joined = header.replace("\\\n", " ")
    return [shlex.split(m) for m in re.findall(rf"python -m {re.escape(module)} [^\n]*", joined)]


def test_the_steps_come_in_the_order_a_renter_acts():
    text = GPU_PAGE.read_text()
    positions = [text.index(step) for step in STEPS]
    assert positions == sorted(positions)
    intro = " ".join(text[: positions[0]].split())
    assert "no GPU has run vLLM, the collective weight transfer or a whole run of this project yet" in intro


def test_the_gpu_install_is_one_command_the_same_in_the_readme():
    page, readme = _gpu_install(GPU_PAGE.read_text()), _gpu_install((ROOT / "README.md").read_text())
    assert len(page) == 1 and readme == page
    command = page[0]
    pins = (ROOT / "constraints" / "gpu.txt").read_text()
    cuda = re.search(r"^torch==[\d.]+\+(cu\d+)$", pins, re.M).group(1)  # type: ignore[union-attr]
    assert (
        f"--extra-index-url https://download.pytorch.org/whl/{cuda}" in command
    )  # a +cuXXX torch is only there
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = re.search(r"-e '\.\[([\w,]+)\]'", command).group(1).split(",")  # type: ignore[union-attr]
    assert {"gpu", "logging"} <= set(extras) <= set(project["optional-dependencies"])
    python = re.match(r"python3\.(\d+) -m venv", command)
    assert python and int(python.group(1)) >= int(project["requires-python"].split(".")[-1])


@pytest.mark.parametrize("name", RECIPES)
def test_a_recipe_header_builds_its_data_and_names_the_evaluation_afterwards(name):
    cfg, header = load_config(name), _header(name)
    (build,) = _commands(header, "exgrpo.data.benchmarks")
    out = Path(build[build.index("--out") + 1])
    assert out / "openr1-math-46k.parquet" == Path(cfg.data.train)  # the file the recipe trains on
    assert "--only" not in build  # all ten: the training file and the nine that --paper-table reads
    assert len(SOURCES) == 10
    assert cfg.data.eval == "" and 'data.eval is ""' in header  # said, not left to be found out
    (evaluate,) = _commands(header, "exgrpo.evaluate")
    args = _parser().parse_args(evaluate[3:])
    assert Path(args.paper_table) == out and args.template == cfg.model.template
    assert args.engine == "vllm" and args.dtype == cfg.model.dtype
    launch = " ".join(header.replace("\\\n", " ").split())
    run_dir = re.search(r"logging\.run_dir=(\S+)", launch).group(1)  # type: ignore[union-attr]
    assert args.model == run_dir  # the run's own directory (its final/ model)
    assert "configs/gpu-smoke.yaml" in header


def test_the_smoke_config_is_the_1_5b_recipe_on_two_gpus():
    smoke, recipe = load_config("gpu-smoke"), load_config("qwen2.5-math-1.5b")
    assert smoke.model.path == recipe.model.path and smoke.data.train == recipe.data.train
    assert (smoke.samplers.num, smoke.samplers.num_gpus, smoke.samplers.engine) == (1, 1, "vllm")
    assert (smoke.learners.num, smoke.learners.num_gpus, smoke.learners.backend) == (1, 1, "nccl")
    assert smoke.async_.weight_sync == "collective" and smoke.replay.start_solve_ratio == 0.0
    t = smoke.trainer
    assert t.steps <= 5 and 0 < t.checkpoint_every < t.steps  # a checkpoint mid-run, and one at the end
    assert smoke.model.max_response_len <= 1024
    header = _header("gpu-smoke")
    for needed in ("Launch:", "Check the placement first:", "python -m exgrpo.data.benchmarks --out /data"):
        assert needed in header
    (evaluate,) = _commands(header, "exgrpo.evaluate")
    args = _parser().parse_args(evaluate[3:])
    assert args.engine == "vllm" and args.template == smoke.model.template and args.num is not None
