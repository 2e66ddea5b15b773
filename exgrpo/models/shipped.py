"""Base models shipped as package data: the same weights on every machine.

The scratchpad bases' recipe (`exgrpo.models.trace_warmup`) gives different bytes on different CPUs, so the built
weights travel with the package. `shipped_model(name)` verifies every file of `exgrpo/models/weights/<name>/`
against its sha256 in `MANIFEST` and fails loudly on a corrupt or missing one. `python -m exgrpo.models.shipped
--verify` checks them all; `--rebuild NAME --out DIR` rebuilds one here and says whether the bytes match. More:
docs/task.md ("Base models: noisy traces, shipped as weights"); tests: tests/exgrpo/models/test_shipped.py.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from exgrpo.models.trace_warmup import (
    SCRATCHPAD_BASE,
    SCRATCHPAD_WEAK,
    TraceWarmupSpec,
    warm_up_traces,
)

WEIGHTS_ROOT = Path(__file__).parent / "weights"


class ShippedModelError(RuntimeError):
    """A shipped model directory whose files are missing or do not match their checksums."""


@dataclass(frozen=True)
class ShippedModel:
    recipe: TraceWarmupSpec  # the spec the weights were built from (recorded in trace_warmup.json)
    sha256: dict[str, str]  # file name -> sha256 of its bytes
    built_on: str  # the machine the weights were built on (the kernels that decided the bytes)


_BUILT_ON = "AMD EPYC (AVX2, no AVX-512), torch 2.13.0+cpu, 1 torch thread"
MANIFEST: dict[str, ShippedModel] = {  # name -> what is shipped
    "scratchpad-base": ShippedModel(
        recipe=SCRATCHPAD_BASE,
        built_on=_BUILT_ON,
        sha256={
            "chat_template.jinja": "578572a7fcbcfc27e5c4dc0918426cd4b4eda803584ce27df024a6c6a39bfc8b",
            "config.json": "124affad189b1a7bbaed7e8ae44075d06d422f5c5e8e722619613ce91ad209f0",
            "generation_config.json": "14432c2565ed8ff4eee0beb78f2b6d2e45076a01e47c872ff8ab4df78374ab22",
            "model.safetensors": "abaea5fb94f61f481d3f75ddb171f461448ffaa7835288f8c8081c8006724230",
            "tokenizer.json": "53757fbb0700c46db3d122cae7d6b2c5205a8a7609623814e3e1dee12bf12066",
            "tokenizer_config.json": "f0915cccd0d0f77154165e924dc42f724e30d12920517a8cf62cc88d3e5bf221",
            "trace_warmup.json": "6ef6cfa5d60c3d4faf704e89cdb2c7f43aa65ceff5085d606582892552c28c69",
        },
    ),
    "scratchpad-weak": ShippedModel(
        recipe=SCRATCHPAD_WEAK,
        built_on=_BUILT_ON,
        sha256={
            "chat_template.jinja": "578572a7fcbcfc27e5c4dc0918426cd4b4eda803584ce27df024a6c6a39bfc8b",
            "config.json": "124affad189b1a7bbaed7e8ae44075d06d422f5c5e8e722619613ce91ad209f0",
            "generation_config.json": "14432c2565ed8ff4eee0beb78f2b6d2e45076a01e47c872ff8ab4df78374ab22",
            "model.safetensors": "c6b64280f0cb3e8366536a4d7476e82c34e4489f5405772c59d0908b30574601",
            "tokenizer.json": "53757fbb0700c46db3d122cae7d6b2c5205a8a7609623814e3e1dee12bf12066",
            "tokenizer_config.json": "f0915cccd0d0f77154165e924dc42f724e30d12920517a8cf62cc88d3e5bf221",
            "trace_warmup.json": "a2effe8b473de718a8d7dadee16907cbbcd120511d30beba13ac01cf8f573824",
        },
    ),
}


def file_sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def verify_dir(directory: Path, sha256: dict[str, str], *, name: str) -> Path:
    """`directory` if every file in `sha256` is there with that checksum; else ShippedModelError."""
    bad = []
    for fname, digest in sorted(sha256.items()):
        path = directory / fname
        if not path.is_file():
            bad.append(f"{fname}: missing")
        elif (actual := file_sha256(path)) != digest:
            bad.append(f"{fname}: sha256 {actual[:12]}..., expected {digest[:12]}...")
    if bad:
        raise ShippedModelError(
            f"shipped model {name!r} at {directory} is damaged ({'; '.join(bad)}); reinstall the exgrpo "
            "package (pip install --force-reinstall exgrpo) or rebuild it with "
            f"`python -m exgrpo.models.shipped --rebuild {name} --out DIR` and set model.path=DIR"
        )
    return directory


def shipped_model(name: str, *, root: Path = WEIGHTS_ROOT) -> Path:
    """The verified directory of shipped model `name` (a key of MANIFEST)."""
    if name not in MANIFEST:
        raise KeyError(f"no shipped model {name!r}; shipped: {', '.join(sorted(MANIFEST))}")
    return verify_dir(root / name, MANIFEST[name].sha256, name=name)


def rebuild(name: str, out: Path) -> bool:
    """Rebuild shipped model `name` from its recipe into `out`; True if bit-identical to the shipped weights."""
    shipped = MANIFEST[name]
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"{out} is not empty; give a new directory")
    t0 = time.perf_counter()
    warm_up_traces(out, spec=shipped.recipe)
    built = file_sha256(out / "model.safetensors")
    same = built == shipped.sha256["model.safetensors"]
    print(
        json.dumps(
            {
                "model": name,
                "out": str(out),
                "build_s": round(time.perf_counter() - t0, 1),
                "model.safetensors sha256": built,
                "shipped sha256": shipped.sha256["model.safetensors"],
                "identical": same,
                "shipped built on": shipped.built_on,
                "this cpu": _cpu(),
            }
        )
    )
    return same


def _cpu() -> str:
    import torch

    return f"torch {torch.__version__}, ATen CPU capability {torch.backends.cpu.get_cpu_capability()}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m exgrpo.models.shipped", description=__doc__.split("\n")[0]
    )
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--verify", action="store_true", help="check every shipped model's files")
    group.add_argument("--rebuild", choices=sorted(MANIFEST), help="rebuild one from its recipe")
    parser.add_argument("--out", type=Path, help="with --rebuild: a new directory for the rebuilt model")
    args = parser.parse_args(argv)
    if args.verify:
        for name in sorted(MANIFEST):
            print(f"{name}: {shipped_model(name)} ok")
        return 0
    if args.out is None:
        parser.error("--rebuild needs --out DIR")
    import torch

    torch.set_num_threads(1)
    return 0 if rebuild(args.rebuild, args.out) else 1


if __name__ == "__main__":
    sys.exit(main())
