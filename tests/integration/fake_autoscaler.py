"""The fake-autoscaler launcher of the elastic tests, now `exgrpo/sim/autoscaler.py` (shared with
`bench/system/bench_elastic.py`); re-exported for the tests that import it from here."""

from exgrpo.sim.autoscaler import FakeAutoscaler, free_port  # noqa: F401
