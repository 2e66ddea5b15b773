"""The learner group's batch split and metric combine, one definition for the real group
(`learners/group.py::LearnerGroup`) and the simulated one (`bench/sim/roles.py::SimLearnerGroup`).

A batch is split into L equal contiguous slices of whole groups, in the order given (`split_groups`);
candidates to score into L contiguous chunks (`split_candidates`). The ranks' answers come back as one:
metrics averaged over the ranks that report a number (NaN-aware), `SUMMED_METRICS` summed, entropies and
picks concatenated in rank (= batch) order (`combine_metrics`, `combine_updates`). Pure: no Ray, no torch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TypeVar

from exgrpo.core import metric_names as M
from exgrpo.core.records import UpdateResult

T = TypeVar("T")

SUMMED_METRICS = (M.LEARNER_TOKENS,)  # summed over ranks; every other metric is averaged (NaN-aware)


def split_groups(groups: Sequence[T], num: int) -> list[Sequence[T]]:
    """`num` equal contiguous slices of whole groups; a batch that does not divide is refused."""
    if len(groups) % num:
        raise ValueError(
            f"a batch of {len(groups)} groups cannot be split into whole groups across {num} learners; "
            f"make questions_per_step a multiple of learners.num={num}"
        )
    per = len(groups) // num
    return [groups[i * per : (i + 1) * per] for i in range(num)]


def split_candidates(candidates: Sequence[T], num: int) -> list[list[T]]:
    """`num` contiguous chunks of ceil(n / num) candidates (the last ones shorter or empty), in order."""
    n, size = len(candidates), math.ceil(len(candidates) / num) if candidates else 0
    return [list(candidates[i * size : min((i + 1) * size, n)]) for i in range(num)]


def concat(parts: Sequence[Sequence[float]]) -> list[float]:
    """The ranks' per-candidate values in rank order: the order of `split_candidates`' input."""
    return [e for part in parts for e in part]


def combine_metrics(results: Sequence[dict[str, float]]) -> dict[str, float]:
    """The ranks' metrics as one: NaN values skipped, `SUMMED_METRICS` summed, the rest averaged (NaN when
    no rank has a number)."""
    out: dict[str, float] = {}
    for key in results[0]:
        values = [r[key] for r in results if not math.isnan(r[key])]
        if key in SUMMED_METRICS:
            out[key] = float(sum(values))
        else:
            out[key] = sum(values) / len(values) if values else math.nan
    return out


def combine_updates(results: Sequence[UpdateResult]) -> UpdateResult:
    """The ranks' `update` results as one: metrics combined, entropies, picks and per-request log-prob gaps in
    rank (= batch) order, the weight sums of the rank that took them (rank 0)."""
    return UpdateResult(
        metrics=combine_metrics([r.metrics for r in results]),
        entropies=tuple(concat([r.entropies for r in results])),
        picks=tuple(p for r in results for p in r.picks),
        weight_sums=next((r.weight_sums for r in results if r.weight_sums), ()),
        logprob_gaps=tuple(g for r in results for g in r.logprob_gaps),
    )
