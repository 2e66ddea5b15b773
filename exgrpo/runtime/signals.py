"""Ctrl-C keeps the work: SIGINT / SIGTERM during training stop the driver at the next step boundary.

The first signal sets the driver's `stop_requested` (it then checkpoints, and the recipe writes the
summary, the report and the resume command); a second one raises KeyboardInterrupt at once. The
previous handlers are put back when training ends.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from exgrpo.reporting.console import PREFIX

if TYPE_CHECKING:
    from exgrpo.loop.driver import Driver


class StopNow(KeyboardInterrupt):
    """The second signal: stop at once. `run_dir`: the run's directory, when the driver's checkpointer knows it
    (the command line then prints the resume command of its latest checkpoint)."""

    def __init__(self, run_dir: Path | None) -> None:
        super().__init__()
        self.run_dir = run_dir


def driver_run_dir(driver: Driver) -> Path | None:
    """The run directory of `driver`, from its checkpointer (`<run_dir>/checkpoints`), None without one."""
    root = getattr(getattr(driver, "checkpointer", None), "root", None)
    return Path(root).parent if root is not None else None


@contextlib.contextmanager
def stop_on_signals(driver: Driver | None) -> Iterator[None]:
    """While training: the first SIGINT (Ctrl-C) or SIGTERM asks the driver to stop at the next step
    boundary (checkpoint, summary, report, the resume command); a second one stops at once
    (`StopNow`, a KeyboardInterrupt carrying the run directory). Only in the main thread (signal handlers live there); without a driver, nothing."""
    if driver is None or threading.current_thread() is not threading.main_thread():
        yield
        return
    signals = (signal.SIGINT, signal.SIGTERM)
    previous = {sig: signal.getsignal(sig) for sig in signals}

    def handler(signum: int, frame: Any) -> None:
        if driver.stop_requested is not None:  # the second one: at once
            for sig, old in previous.items():
                signal.signal(sig, old)
            raise StopNow(driver_run_dir(driver))
        driver.stop_requested = signal.Signals(signum).name
        print(
            f"\n{PREFIX} {driver.stop_requested}: stopping at the next step boundary to write a checkpoint, "
            "the summary and the report (Ctrl-C again to stop at once, losing the steps since the last "
            "checkpoint)",
            file=sys.stderr,
            flush=True,
        )

    for sig in signals:
        signal.signal(sig, handler)
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
