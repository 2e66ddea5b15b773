"""`ConfigError`, the one error an invalid configuration raises (importable from `exgrpo.core.config`)."""

from __future__ import annotations


class ConfigError(ValueError):
    """An invalid configuration; the message names the field and the fix."""
