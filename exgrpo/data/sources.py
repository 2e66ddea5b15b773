"""Where a run's questions come from: a builtin seeded task or dataset files (config `data`)."""

from __future__ import annotations

import logging

from exgrpo.config import Config
from exgrpo.types import Prompt

log = logging.getLogger(__name__)


def load_prompts(cfg: Config) -> tuple[list[Prompt], list[Prompt]]:
    """(train, eval) prompts for a config; bad rows are skipped with a count or rejected per config."""
    d = cfg.data
    if d.train.startswith("builtin:"):
        from exgrpo.data.tasks import builtin_task

        task = builtin_task(d.train.removeprefix("builtin:"))
        train = task.make_split(split="train", n=d.num_train, seed=d.seed)
        evaluation = task.make_split(split="eval", n=d.num_eval, seed=d.seed) if not d.eval else _read(cfg, d.eval)
        return train, evaluation
    return _read(cfg, d.train), (_read(cfg, d.eval) if d.eval else [])


def _read(cfg: Config, path: str) -> list[Prompt]:
    from exgrpo.data.readers import read_prompts

    result = read_prompts(path, question_key=cfg.data.question_key, answer_key=cfg.data.answer_key,
                          on_bad_row=cfg.data.on_bad_row)
    if result.skipped:
        log.warning("%s: skipped %d malformed rows (first: %s)", path, len(result.skipped), result.skipped[:3])
    return list(result.prompts)
