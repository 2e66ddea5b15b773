"""bench/learner/device_prepare.py: which wheels travel to the GPU machine (DeepSpeed's run-time closure less
what torch brings), without the network; the download itself is not run here."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.learner.device_prepare import RUN, requirements, to_carry  # noqa: E402


def test_deepspeeds_import_time_needs_travel_and_torchs_own_do_not():
    carry = to_carry()
    # DeepSpeed's own requirements, pydantic's, and typing-extensions (pydantic needs a newer one than torch)
    for name in ("einops", "hjson", "msgpack", "ninja", "psutil", "py-cpuinfo", "pydantic", "pydantic-core"):
        assert name in carry, name
    assert {"annotated-types", "typing-inspection", "typing-extensions"} <= set(carry)
    assert not {"torch", "numpy", "sympy", "filelock", "deepspeed"} & set(carry)  # the device's, or built
    assert all(v and v[0].isdigit() for v in carry.values())  # pinned to what runs here
    assert "torch" in requirements("torch") and "typing-extensions" in requirements("torch")


def test_the_device_command_installs_the_wheels_and_runs_the_stream_part():
    assert RUN.startswith("python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl")
    assert "--parts export,memory,slicing,sdpa,stream" in RUN and "tee $OUT/device_check.log" in RUN
