"""Prepare what travels to a GPU machine for the device check, in one command, and check that it fits.

    .venv/bin/python -m bench.learner.device_prepare --python-version 3.12   # the GPU machine's Python

Writes DeepSpeed's wheels (``.whl/``) and vLLM's carried files (``.vllm_carry/``), sums what travels against the
device tool's limit (exit status 1 over it) and prints the command to run there (docs/benchmarks.md, "GPU device
check").
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, requires, version
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
WHEELS = ROOT / ".whl"
LIMIT_BYTES = 64 * 2**20  # what the device tool carries, working tree and carried folders together
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux1_x86_64")
# what the device has for sure: torch with what it requires, and numpy. Not transformers' closure: the lent H200
# image had transformers without pydantic, which transformers' hub client requires here (docs/benchmarks.md)
ON_DEVICE = ("torch", "numpy")
NEWER_THAN_TORCH = ("typing-extensions",)  # torch requires it too, but pydantic a newer one
RUN = (
    "python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export "
    "PYTHONPATH=/tmp/site:$PWD && set -o pipefail && PYTHONUNBUFFERED=1 python3 -m bench.learner.device_check "
    "--parts export,memory,slicing,sdpa,stream --budget-s 400 --out $OUT 2>&1 | tee $OUT/device_check.log"
)


def requirements(name: str) -> set[str]:
    """``name`` and everything it requires at run time, transitively (extras left out), canonical names."""
    seen: set[str] = set()
    todo = [canonicalize_name(name)]
    while todo:
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        try:
            reqs = requires(current) or []
        except PackageNotFoundError:
            continue  # not installed here: nothing it needs is known (the download then fails loudly)
        for text in reqs:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(canonicalize_name(req.name))
    return seen


def to_carry() -> dict[str, str]:
    """Package -> version installed here, for DeepSpeed's run-time closure less what the device has."""
    have: set[str] = set()
    for name in ON_DEVICE:
        have |= requirements(name)
    have -= set(NEWER_THAN_TORCH)
    wanted = sorted(requirements("deepspeed") - have - {"deepspeed"})
    return {name: version(name) for name in wanted}


def download(python_version: str, packages: dict[str, str], dest: Path) -> None:
    """Binary wheels of ``packages`` for ``python_version`` on x86-64 Linux, and DeepSpeed's (pure Python)."""
    platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
    pins = [f"{name}=={ver}" for name, ver in packages.items()]
    pip = [sys.executable, "-m", "pip"]
    subprocess.run(
        [*pip, "download", "-q", "--no-deps", "--only-binary=:all:", "--implementation", "cp"]
        + ["--python-version", python_version, *platforms, "-d", str(dest), *pins],
        check=True,
    )
    ds = f"deepspeed=={version('deepspeed')}"  # an sdist only: built without isolation against torch here
    subprocess.run(
        [*pip, "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(dest), ds], check=True
    )
    built = sorted(dest.glob("deepspeed-*.whl"))
    if not built or not built[-1].name.endswith("-py3-none-any.whl"):
        raise RuntimeError(
            f"DeepSpeed's wheel is not pure Python ({[p.name for p in built]}): it cannot travel"
        )


def check_carried_vllm() -> None:
    """Import the export path with the carried vLLM files alone, in a fresh interpreter (as on the device)."""
    code = (
        f"import sys; sys.path.insert(0, {str(ROOT)!r})\n"
        "from bench.learner.carry_vllm import CARRY, ensure_vllm\n"
        "ensure_vllm(prefer_carry=True)\n"
        "from exgrpo.transport.vllm_api import LearnerSource, WeightPusher\n"
        "bad = [n for n, m in sys.modules.items() if n.split('.')[0] == 'vllm'\n"
        "       and str(CARRY) not in str(getattr(m, '__file__', None))]\n"
        "assert not bad, f'vLLM modules not from the carried files: {bad}'\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        raise RuntimeError(
            "the export path does not import from the carried vLLM files (a module it now needs is not carried: "
            f"add it to bench/learner/carry_vllm.py):\n{proc.stderr[-2000:]}"
        )


def tree_bytes() -> int:
    """Bytes of the working tree that travels: tracked files and untracked ones git does not ignore."""
    out = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout
    paths = (ROOT / p for p in out.decode().split("\0") if p)
    return sum(p.stat().st_size for p in paths if p.is_file())


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--python-version",
        required=True,
        help="the GPU machine's Python, e.g. 3.12 (python3 --version there)",
    )
    args = parser.parse_args(argv)
    from bench.learner.carry_vllm import CARRY, carry

    packages = to_carry()
    if WHEELS.exists():
        for old in WHEELS.glob("*.whl"):
            old.unlink()  # wheels of another Python must not travel beside these
    WHEELS.mkdir(exist_ok=True)
    download(args.python_version, packages, WHEELS)
    carry()
    check_carried_vllm()
    wheels, carried, tree = folder_bytes(WHEELS), folder_bytes(CARRY), tree_bytes()
    for path in sorted(WHEELS.glob("*.whl")):
        print(f"{path.stat().st_size / 2**20:7.2f} MiB  .whl/{path.name}")
    total = wheels + carried + tree
    mib = 2**20
    print(
        f"travels: .whl {wheels / mib:.2f} MiB ({len(packages) + 1} wheels), .vllm_carry {carried / mib:.2f} MiB, "
        f"working tree {tree / mib:.2f} MiB; {total / mib:.2f} MiB of {LIMIT_BYTES / mib:.0f} MiB"
    )
    if total > LIMIT_BYTES:
        print("!!! over the device tool's limit: it will not travel", file=sys.stderr)
        return 1
    print(f"on the device, carry [.whl, .vllm_carry], timeout_s 480:\n    {RUN}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
