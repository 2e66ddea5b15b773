"""The valid range of a numeric setting, declared once (`exgrpo.core.config.BOUNDS`).

One declaration serves two readers: `validate` checks the value against it and the settings
reference (`exgrpo.core.config_reference`, docs/config.md) prints it, so the documented range
and the enforced one cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

ValueOf = Callable[[str], Any]  # a setting's value by its YAML name ("trainer.rollouts_per_question")


@dataclass(frozen=True)
class Bound:
    """`lo` and `hi` are numbers or the YAML name of another setting (the range of `replay.mu` ends
    at `trainer.rollouts_per_question`); `open_lo`/`open_hi` exclude the end itself. `note` says what
    the ends mean and goes into the error message. A null value of an optional setting is valid."""

    lo: float | str | None = None
    hi: float | str | None = None
    open_lo: bool = False
    open_hi: bool = False
    note: str = ""

    def __post_init__(self) -> None:
        if self.lo is None and self.hi is None:
            raise ValueError("a Bound needs lo, hi or both")

    @property
    def interval(self) -> bool:
        return self.lo is not None and self.hi is not None

    def text(self, value_of: ValueOf | None = None) -> str:
        """'>= 1', '> 0', '[0, 1]', '(0, 1]'; with `value_of`, an end that names a setting shows its value
        ('trainer.rollouts_per_question=8')."""

        def end(x: float | str | None) -> str:
            if isinstance(x, str):
                return f"{x}={value_of(x)}" if value_of is not None else x
            return f"{x:g}" if x is not None else ""

        if self.interval:
            left, right = "(" if self.open_lo else "[", ")" if self.open_hi else "]"
            return f"{left}{end(self.lo)}, {end(self.hi)}{right}"
        if self.lo is not None:
            return f"{'>' if self.open_lo else '>='} {end(self.lo)}"
        return f"{'<' if self.open_hi else '<='} {end(self.hi)}"

    def error(self, key: str, value_of: ValueOf) -> str | None:
        """The message for setting `key` when its value lies outside this range, else None."""
        value = value_of(key)
        if value is None:
            return None
        lo = value_of(self.lo) if isinstance(self.lo, str) else self.lo
        hi = value_of(self.hi) if isinstance(self.hi, str) else self.hi
        above = lo is None or (value > lo if self.open_lo else value >= lo)
        below = hi is None or (value < hi if self.open_hi else value <= hi)
        if above and below:
            return None
        verb = "lie in" if self.interval else "be"
        return f"{key}={value} must {verb} {self.text(value_of)}" + (f" ({self.note})" if self.note else "")
