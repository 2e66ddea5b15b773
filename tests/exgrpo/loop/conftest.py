"""The loop's tests import the shared fakes (tests/exgrpo/fakes.py) and `loop_harness` from this folder."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/exgrpo: `from fakes import ...`
