"""Where questions come from: a `builtin:<task>` seeded generator or a dataset file.

`builtin_name` is the one parser of the `builtin:` prefix (tasks here, models in
`exgrpo.models.resolve`); `read_source` is the one dispatch from a data spec to prompts, used by
the training run (`load_prompts`, config `data`), `python -m exgrpo.evaluate` and the benchmarks.
Imports nothing heavy at module level (the readers need pyarrow, the tasks numpy).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from exgrpo.core.config import BUILTIN_PREFIX, builtin_name
from exgrpo.core.records import Prompt

if TYPE_CHECKING:
    from exgrpo.core.config import Config
    from exgrpo.data.readers import BadRow, BadRowPolicy
    from exgrpo.data.tasks import Split

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SourceData:
    """The prompts of one data spec and what was skipped on the way."""

    prompts: tuple[Prompt, ...]
    name: str  # the builtin task's name or the file's stem (names output files: eval-<name>.json)
    skipped: tuple[BadRow, ...] = ()  # malformed rows of a file (none for a builtin task)

    @property
    def rows_read(self) -> int:
        """Rows seen: valid plus skipped."""
        return len(self.prompts) + len(self.skipped)


def read_source(
    spec: str,
    *,
    split: Split,
    num: int,
    seed: int = 0,
    question_key: str = "question",
    answer_key: str = "answer",
    on_bad_row: BadRowPolicy = "skip",
    for_reward_fn: bool = False,
) -> SourceData:
    """`builtin:<task>`: `num` questions of the task's `split` split drawn with `seed`; anything
    else: every row of a parquet/jsonl file (`exgrpo.data.readers.read_prompts`, which raises a
    `DataError` for unreadable files; `split`, `num` and `seed` do not apply to files)."""
    from exgrpo.data.readers import DataError, read_prompts

    name = builtin_name(spec)
    if name is not None:
        from exgrpo.data.tasks import BUILTIN_TASKS, builtin_task

        if name not in BUILTIN_TASKS:
            raise DataError(
                f"unknown builtin task {spec!r}; valid: "
                f"{', '.join(BUILTIN_PREFIX + n for n in sorted(BUILTIN_TASKS))}, or a parquet/jsonl path"
            )
        prompts = builtin_task(name).make_split(split=split, n=num, seed=seed)
        return SourceData(tuple(prompts), name)

    result = read_prompts(
        spec,
        question_key=question_key,
        answer_key=answer_key,
        on_bad_row=on_bad_row,
        for_reward_fn=for_reward_fn,
    )
    from exgrpo.data.hf_datasets import is_dataset_spec, source_name

    name = source_name(spec) if is_dataset_spec(spec) else Path(spec).stem
    return SourceData(result.prompts, name, result.skipped)


def load_prompts(cfg: Config) -> tuple[list[Prompt], list[Prompt]]:
    """(train, eval) prompts for a config; bad rows are skipped with a count or rejected per config.

    eval: `data.eval` when set (a file or `builtin:<task>`, whose held-out split is used), else the
    held-out split of a builtin `data.train`, else none.
    """
    d = cfg.data
    train = _read(cfg, d.train, split="train", num=d.num_train)
    if d.eval:
        evaluation = _read(cfg, d.eval, split="eval", num=d.num_eval)
    elif builtin_name(d.train) is not None:
        evaluation = _read(cfg, d.train, split="eval", num=d.num_eval)
    else:
        evaluation = []
    return train, evaluation


def _read(cfg: Config, spec: str, *, split: Split, num: int) -> list[Prompt]:
    d = cfg.data
    data = read_source(
        spec,
        split=split,
        num=num,
        seed=d.seed,
        question_key=d.question_key,
        answer_key=d.answer_key,
        on_bad_row=d.on_bad_row,
        for_reward_fn=cfg.reward.fn != "math",
    )
    if data.skipped:
        first = "; ".join(f"row {b.row}: {b.reason}" for b in data.skipped[:3])
        log.warning(
            "%s: skipped %d of %d rows as malformed (data.on_bad_row=skip; set data.on_bad_row=error to "
            "fail instead); first: %s",
            spec,
            len(data.skipped),
            data.rows_read,
            first,
        )
    return list(data.prompts)
