"""One vLLM-CPU engine's weight load of the ~100M fp32 model: direct load against vLLM's reload and a memcpy.

    .venv/bin/python -m bench.weights.bench_vllm_load [--repeats 9]

No Ray; the two paths alternate so both see the same load. How: docs/benchmarks.md, "Weight sync against the
memory floor".
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, cast

from bench.common import env_defaults, stopwatch

env_defaults(ray=True)

import numpy as np  # noqa: E402
import torch  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

from actors.factory import make_engine  # noqa: E402
from bench.weights.model_100m import MODEL, SPEC_100M  # noqa: E402  (registers builtin:bench-100m)
from exgrpo.core.config_files import load_config  # noqa: E402
from exgrpo.models.resolve import resolve_model  # noqa: E402
from exgrpo.transport.packed import PackedWeights, Packer, unpack_weights  # noqa: E402

if TYPE_CHECKING:
    from actors.vllm_engine import VLLMEngine

WARMUP = 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=9)
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    torch.set_num_threads(1)
    cfg = load_config("tiny-cpu", [f"model.path={MODEL}"])
    model_dir = resolve_model(cfg.model.path, cache_dir=cfg.model.cache_dir)
    engine = cast("VLLMEngine", make_engine("vllm", model_dir, seed=0))
    state = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).state_dict()
    packed = Packer().pack(state)
    buffer = packed.buffer.copy()
    buffer.flags.writeable = False
    views = unpack_weights(PackedWeights(layout=packed.layout, buffer=buffer))
    copy = np.empty_like(buffer)
    times: dict[str, list[float]] = {"direct": [], "reload": [], "memcpy": []}
    for i in range(2 * (args.repeats + WARMUP)):
        path = ("direct", "reload")[i % 2]
        engine.weight_path = path
        with stopwatch() as load:
            engine.load_weights(views, version=i + 1)
        times[path].append(load.s)
        with stopwatch() as memcpy:
            np.copyto(copy, buffer)
        times["memcpy"].append(memcpy.s)
    med = {k: float(np.median(v[WARMUP:])) for k, v in times.items()}
    print(
        f"{SPEC_100M.num_layers}-layer model, {buffer.nbytes / 1e6:.0f} MB packed, {args.repeats} repeats each"
    )
    for path in ("direct", "reload", "memcpy"):
        counted = times[path][WARMUP:]
        print(
            f"{path:<8} median {med[path] * 1e3:7.1f} ms  best {min(counted) * 1e3:7.1f} ms  "
            f"/ memcpy {med[path] / med['memcpy']:5.2f}"
        )
    print(f"reload / direct: {med['reload'] / med['direct']:.2f}")


if __name__ == "__main__":
    main()
