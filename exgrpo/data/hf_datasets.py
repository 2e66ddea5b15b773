"""Datasets from the Hugging Face `datasets` library as data sources (`data.train`, `data.eval`, `evaluate --data`).

- a `Dataset.save_to_disk` directory: `DIR` (a Dataset, or a DatasetDict with one split or a `train` split) or
  `DIR@split` (a DatasetDict's split), read with `datasets.load_from_disk`;
- `hf:org/name[:config][@split]`: the dataset repo's snapshot in the hub cache (`huggingface_hub.snapshot_download`
  with `repo_type="dataset"`: the cache first, else downloaded; `HF_HOME`, `HF_TOKEN`, `HF_HUB_OFFLINE` honoured),
  then `datasets.load_dataset(<snapshot>, config, split=split)` (split `train` when none is given).

The rows then go through the same layouts, qids and bad-row rules as a parquet or JSON-lines file
(`exgrpo.data.readers.read_prompts`).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from exgrpo.data.errors import DataError

HF_PREFIX = "hf:"
DISK_MARKERS = ("dataset_info.json", "dataset_dict.json", "state.json")


def _disk_dir(spec: str) -> tuple[Path, str | None] | None:
    """(directory, split or None) when `spec` names a `save_to_disk` directory (optionally `DIR@split`)."""
    for where, split in ((spec, None), tuple(spec.rsplit("@", 1)) if "@" in spec else (None, None)):
        if where is None:
            continue
        d = Path(where).expanduser()
        if d.is_dir() and any((d / m).is_file() for m in DISK_MARKERS):
            return d, split
    return None


def is_dataset_spec(spec: str) -> bool:
    """Whether `spec` is read through `datasets` (a save_to_disk directory or `hf:...`)."""
    return spec.startswith(HF_PREFIX) or _disk_dir(spec) is not None


def parse_hf(spec: str) -> tuple[str, str | None, str]:
    """`hf:org/name[:config][@split]` -> (repo id, config or None, split)."""
    body = spec[len(HF_PREFIX) :]
    body, _, split = body.partition("@")
    repo, _, config = body.partition(":")
    if not repo or repo.count("/") > 1:
        raise DataError(f"{spec!r}: a hub dataset is hf:org/name[:config][@split]")
    return repo, config or None, split or "train"


def source_name(spec: str) -> str:
    """The data source name of a dataset spec's rows (what per-source scores are keyed by)."""
    if spec.startswith(HF_PREFIX):
        repo, config, split = parse_hf(spec)
        return f"{repo.split('/')[-1]}{f'-{config}' if config else ''}-{split}"
    disk = _disk_dir(spec)
    assert disk is not None
    return disk[0].name + (f"-{disk[1]}" if disk[1] else "")


def hub_snapshot(spec: str, repo: str) -> Path:
    """The local snapshot of dataset repo `repo`: from the hub cache when it holds one, else downloaded."""
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        return Path(snapshot_download(repo, repo_type="dataset", local_files_only=True))
    except LocalEntryNotFoundError:
        if constants.HF_HUB_OFFLINE:
            raise DataError(
                f"dataset {spec!r} is not in the hub cache ({constants.HF_HUB_CACHE}) and HF_HUB_OFFLINE is set: "
                f"download it first (`hf download --repo-type dataset {repo}` with the same HF_HOME), unset "
                "HF_HUB_OFFLINE, or give a file or a save_to_disk directory"
            ) from None
    print(f"downloading the dataset {repo} into the hub cache {constants.HF_HUB_CACHE}", flush=True)
    return Path(snapshot_download(repo, repo_type="dataset"))


def load_rows(spec: str) -> tuple[list[str], Iterator[tuple[int, dict[str, Any]]]]:
    """(column names, (row, record) pairs) of a dataset spec; a `DataError` when it cannot be loaded."""
    try:
        import datasets
    except ImportError as err:  # pragma: no cover - a core dependency
        raise DataError(f"{spec!r} needs the `datasets` package (pip install datasets)") from err
    try:
        if spec.startswith(HF_PREFIX):
            repo, config, split = parse_hf(spec)
            data: Any = datasets.load_dataset(str(hub_snapshot(spec, repo)), config, split=split)
        else:
            directory, split_or_none = _disk_dir(spec)  # type: ignore[misc]
            data = datasets.load_from_disk(str(directory))
            if isinstance(data, datasets.DatasetDict):
                splits = list(data)
                chosen = split_or_none or (splits[0] if len(splits) == 1 else "train")
                if chosen not in data:
                    raise DataError(f"{spec!r} holds the splits {splits}: name one as {directory}@<split>")
                data = data[chosen]
            elif split_or_none:
                raise DataError(f"{spec!r}: {directory} holds one Dataset, not splits; drop @{split_or_none}")
    except DataError:
        raise
    except Exception as err:  # datasets raises many kinds: missing repo, offline, bad config or split
        raise DataError(f"cannot load the dataset {spec!r}: {type(err).__name__}: {err}") from err
    return list(data.column_names), enumerate(data.to_list())
