"""`python -m exgrpo.plan --config X [key=value ...]`: the predicted peak memory per GPU learner rank and
per GPU sampler (exgrpo/runtime/memory_plan.py). Exit 0 when the plan fits, 2 when it does not (with the
setting to change) or the config is invalid."""

from __future__ import annotations

import argparse
import sys

from exgrpo.core.config import ConfigError
from exgrpo.core.config_files import load_config
from exgrpo.runtime.memory_plan import KNOWN, plan, read_shape, render


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m exgrpo.plan", description=__doc__)
    ap.add_argument("--config", default=None, help="YAML config (default: the packaged default)")
    ap.add_argument("--gpu-memory-gib", type=float, default=80.0, help="memory of one GPU (default: 80)")
    ap.add_argument(
        "--shape", choices=sorted(KNOWN), default=None, help="a known model shape instead of model.path"
    )
    ap.add_argument("overrides", nargs="*", help="key.sub=value overrides")
    args = ap.parse_args(argv)
    if not args.gpu_memory_gib > 0:
        print("error: --gpu-memory-gib must be > 0", file=sys.stderr)
        return 2
    try:
        cfg = load_config(args.config, args.overrides)
        shape = read_shape(cfg.model.path, name=args.shape)
    except (ConfigError, ValueError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    p = plan(cfg, shape, device_gib=args.gpu_memory_gib)
    title = (
        f"memory plan: {cfg.model.path} ({shape.params / 1e9:.2f} B parameters, {cfg.model.dtype}), "
        f"{args.gpu_memory_gib:.0f} GiB per GPU"
    )
    print(render(p, title=title))
    return 0 if p.fits else 2


if __name__ == "__main__":
    sys.exit(main())
