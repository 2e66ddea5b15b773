"""Generations you can read: a few of a step's trained completions, every `logging.samples_every` steps.

Metrics say how often the policy is right; they never show what it writes. `SampleLog`, an observer of
the driver, appends a few rows of the step's training batch to `<run_dir>/samples.jsonl` (one JSON object
per completion, docs/metrics.md "samples.jsonl") and hands the same rows to the logger's TensorBoard and
W&B backends; report.html shows the last sampled steps (`exgrpo.reporting.report`).

The rows are chosen from the batch alone (`choose`), so the same batch always gives the same rows: groups
in request order (the driver's issue order, not the shuffled training order), one completion per group
in turn. When the batch holds both stored trajectories replayed from the buffer and fresh rollouts, both
are shown (about half each), since how replayed text compares with fresh text is what replay is about.
The prompt is the question text the driver already holds, so sampling costs no Ray call.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from exgrpo.core.fileio import atomic_write_text
from exgrpo.core.records import Group, TrainBatch, Trajectory
from exgrpo.loop.observer import Observer

FIELDS = ("step", "qid", "prompt", "completion", "reward", "bucket", "origin", "policy_version")

Sink = Callable[[list[dict[str, Any]], int], None]  # (rows, step): e.g. `MetricsLogger.log_samples`


def _round_robin(
    pools: Sequence[Sequence[tuple[Group, Trajectory]]], n: int
) -> list[tuple[Group, Trajectory]]:
    """Up to n items: the first of every pool, then the second of every pool, and so on."""
    out: list[tuple[Group, Trajectory]] = []
    depth = 0
    while len(out) < n and any(depth < len(p) for p in pools):
        out += [p[depth] for p in pools if depth < len(p)][: n - len(out)]
        depth += 1
    return out


def choose(batch: TrainBatch, n: int) -> list[tuple[Group, Trajectory]]:
    """n completions of the batch (fewer if it has fewer), deterministic, both origins when both exist.

    Replayed: the stored trajectory in slot 0 of each replay group. Fresh: every other trajectory, one
    per group in turn (slot order inside a group). With both present, the replayed get n // 2 places
    (at least one) and the fresh the rest; a side with too few leaves its places to the other.
    """
    groups = sorted(batch.groups, key=lambda g: g.request_id)
    replayed = [(g, t) for g in groups for t in g.trajectories if t.replayed]
    fresh_by_group = [[(g, t) for t in g.trajectories if not t.replayed] for g in groups]
    n_fresh = sum(len(p) for p in fresh_by_group)
    share = max(n // 2, 1) if n_fresh and n >= 2 else n
    n_replayed = min(len(replayed), max(share, n - n_fresh))
    fresh = _round_robin(fresh_by_group, n - n_replayed)
    return replayed[:n_replayed] + fresh


def rows(batch: TrainBatch, *, step: int, questions: Mapping[str, str], n: int) -> list[dict[str, Any]]:
    """The `samples.jsonl` rows of `choose(batch, n)` (fields: `FIELDS`)."""
    out = []
    for group, t in choose(batch, n):
        out.append(
            {
                "step": step,
                "qid": group.qid,
                "prompt": questions[group.qid],
                "completion": t.text,
                "reward": float(t.reward),
                "bucket": f"{group.num_correct}/{group.group_size}",
                "origin": "replayed" if t.replayed else "fresh",
                "policy_version": t.policy_version,
            }
        )
    return out


def read_samples(path: Path) -> list[dict[str, Any]]:
    """The rows of a samples.jsonl ([] when the run wrote none)."""
    path = Path(path)
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def last_steps(samples: Sequence[dict[str, Any]], k: int) -> list[dict[str, Any]]:
    """The rows of the last k sampled steps, newest step first (what report.html shows)."""
    steps = sorted({r["step"] for r in samples}, reverse=True)[:k]
    return [r for s in steps for r in samples if r["step"] == s]


class SampleLog(Observer):
    """Every `every` steps (steps 0, every, 2 * every, ...), `per_step` rows of the step's batch to `path`
    and to `sink` (the logger's TensorBoard text and W&B table).

    `questions` maps each training qid to its question text. A resumed run first drops the rows of steps
    it trains again (those after its checkpoint), so no step appears twice.
    """

    def __init__(
        self,
        path: Path,
        *,
        questions: Mapping[str, str],
        every: int,
        per_step: int,
        sink: Sink | None = None,
    ) -> None:
        if every < 1 or per_step < 1:
            raise ValueError(f"SampleLog needs every >= 1 and per_step >= 1, got {every} and {per_step}")
        self.path = Path(path)
        self.questions, self.every, self.per_step, self.sink = questions, every, per_step, sink
        self._pending: TrainBatch | None = None

    def on_train_start(self, *, system: Any, driver: Any) -> None:
        written = read_samples(self.path)
        kept = [r for r in written if r["step"] < driver.step]
        if len(kept) < len(written):
            atomic_write_text(self.path, "".join(json.dumps(r) + "\n" for r in kept))

    def on_batch(self, *, batch: TrainBatch) -> None:
        self._pending = batch  # its step is known at on_step

    def on_step(self, *, record: dict[str, Any]) -> None:
        batch, self._pending = self._pending, None
        step = int(record["step"])
        if batch is None or step % self.every:
            return
        chosen = rows(batch, step=step, questions=self.questions, n=self.per_step)
        with self.path.open("a") as f:
            f.writelines(json.dumps(r) + "\n" for r in chosen)
        if self.sink is not None:
            self.sink(chosen, step)


def as_markdown(samples: Sequence[dict[str, Any]]) -> str:
    """The rows as TensorBoard text (Markdown): a heading line per row, the prompt and completion as
    indented blocks, which TensorBoard shows verbatim (model output is never read as Markdown)."""

    def block(text: str) -> str:
        return "\n".join("    " + line for line in (text or "(empty)").splitlines() or [""])

    parts = []
    for r in samples:
        parts.append(
            f"**{r['origin']}** qid `{r['qid']}`, reward {r['reward']:g}, bucket {r['bucket']}, "
            f"policy version {r['policy_version']}\n\nprompt:\n\n{block(r['prompt'])}\n\n"
            f"completion:\n\n{block(r['completion'])}"
        )
    return "\n\n---\n\n".join(parts)
