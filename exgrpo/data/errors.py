"""`DataError`, shared by the file readers (`exgrpo.data.readers`, which re-exports it) and `exgrpo.data.hf_datasets`."""

from __future__ import annotations


class DataError(ValueError):
    """An unreadable dataset: unknown format or layout, malformed rows (with their row numbers)."""
