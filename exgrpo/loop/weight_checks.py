"""The run checks its own weights every step, fail-closed (`checks.*`; docs/metrics.md, "Weight checks").

Two checks on the driver, neither costing a forward:

- **checksum**: the per-layer sums of what a sampler serves at version v (`RolloutResult.served_sums`, taken inside
  its engine right after that version's load) against those of what the learner sent for v
  (`UpdateResult.weight_sums`, rank 0, the exported tensors); a layer whose sums differ by more than
  `checks.checksum_tolerance` of its sum of |w| fails the sampler at v. Catches a load that did nothing (once the
  version's change of a layer's sum passes the tolerance), a tensor loaded into the wrong layer, missing or garbage
  weights; not a swap of two same-shape tensors inside one layer (`exgrpo.transport.checksums`).
- **log-prob gap**: per sampler, the share of its compared tokens (fresh, sampled at the version the learner
  trains them at: `learners.update.logprob_gap`) more than `checks.logprob_bound` nats from the learner's
  log-prob; above `checks.logprob_max_share` (with at least `checks.logprob_min_tokens` tokens) the sampler fails
  at that step. Catches what changes outputs, whatever the checksum saw.

A sampler that fails either check `checks.max_failures` times in a row (versions for the checksum, steps for the
gap; a pass resets the count) stops the run: `WeightCheckFailed` names it, the version and the cause. A check that
cannot run (temperature or top-p other than 1, continuous or tensor-parallel samplers, roles that report no sums)
says so once, loudly. Imports no Ray. Tests: tests/exgrpo/loop/test_weight_checks.py,
tests/integration/test_weight_checks_run.py.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Any

from exgrpo.core.config import ChecksConfig, Config
from exgrpo.core.records import RolloutResult, TrainBatch, UpdateResult

log = logging.getLogger(__name__)

KEEP_VERSIONS = 8  # the learner's sums kept for samplers that report a version late


class WeightCheckFailed(RuntimeError):
    """A sampler failed a weight check `checks.max_failures` times in a row: the run stops with the cause."""


def checksum_on(cfg: Config) -> bool:
    """Whether the checksum check runs: asked for, and the samplers can sum their whole weights (one engine
    worker each, not the continuous sampler)."""
    s = cfg.samplers
    return cfg.checks.checksum and not s.continuous and s.tensor_parallel_size == 1


def gap_on(cfg: Config) -> bool:
    """Whether the log-prob gap is measured: asked for, at T = 1 and top_p = 1 (elsewhere the sampler's log-probs
    are of the tempered, truncated distribution and the learner's of the policy: not comparable)."""
    s = cfg.samplers
    return cfg.checks.logprob_gap and s.temperature == 1.0 and s.top_p == 1.0


def why_off(cfg: Config) -> list[str]:
    """One line per check the config asks for that cannot run, with the reason."""
    s, out = cfg.samplers, []
    if cfg.checks.checksum and not checksum_on(cfg):
        why = (
            "samplers.continuous=true"
            if s.continuous
            else f"samplers.tensor_parallel_size={s.tensor_parallel_size}"
        )
        out.append(f"checks.checksum is off: samplers with {why} do not sum their served weights")
    if cfg.checks.logprob_gap and not gap_on(cfg):
        out.append(
            f"checks.logprob_gap is off: at samplers.temperature={s.temperature:g}, top_p={s.top_p:g} the "
            "samplers' log-probs are of another distribution than the learner's (compared at 1 and 1 only)"
        )
    return out


class WeightChecks:
    """The checks' state over a run: who sampled which request, the learner's sums per version, each sampler's
    failures in a row. The driver calls `on_result` for every sampler result and `on_update` for every landed
    update; both raise `WeightCheckFailed`."""

    def __init__(self, cfg: ChecksConfig, *, checksum: bool, gap: bool) -> None:
        self.cfg, self.checksum, self.gap = cfg, checksum, gap
        self.sampler_of: dict[int, str] = {}  # request id -> the sampler that sampled it
        self.sent: dict[int, tuple[tuple[str, float, float], ...]] = {}  # version -> the learner's sums
        self.served: dict[tuple[str, int], tuple[tuple[str, float], ...]] = {}  # awaiting the learner's sums
        self.judged: set[tuple[str, int]] = set()  # (sampler, version) compared
        self.in_a_row: dict[tuple[str, str], int] = {}  # (check, sampler) -> failures in a row
        self.failures = 0  # every failed check of the run
        self.checked = 0  # every (sampler, version) compared
        self.worst_match = 0.0  # the largest |served - sent| / sum of |w| of a comparison that passed
        # per version: the largest |sum - the previous version's| / sum of |w| over the layers (what a sampler
        # one version behind would be off by: the checksum sees it when it passes checks.checksum_tolerance)
        self.version_changes: list[float] = []
        self._said: set[str] = set()

    @classmethod
    def from_config(cls, cfg: Config) -> WeightChecks:
        for line in why_off(cfg):
            log.warning("%s", line)
        return cls(cfg.checks, checksum=checksum_on(cfg), gap=gap_on(cfg))

    def batch_options(self) -> dict[str, Any]:
        """What every `TrainBatch` asks of the learners for these checks."""
        return {"gap_bound": self.cfg.logprob_bound if self.gap else None, "weight_sums": self.checksum}

    # -- the driver's calls ---------------------------------------------------------------------------
    def on_result(self, result: RolloutResult) -> None:
        """A sampler's result: remember who sampled its requests; compare its served sums (once per version)."""
        if self.gap:
            self.sampler_of.update(dict.fromkeys(result.request_ids, result.sampler))
        if not self.checksum:
            return
        key = (result.sampler, result.policy_version)
        if key in self.judged or key in self.served or result.policy_version == 0:
            return  # version 0: the weights on disk, which the learner never sent
        if not result.served_sums:
            self._say(f"served:{result.sampler}", f"{result.sampler} reports no served weight sums")
            return
        self.served[key] = result.served_sums
        self._compare(result.policy_version)

    def on_update(self, batch: TrainBatch, result: UpdateResult) -> None:
        """A landed update of `batch`, trained at `batch.version`: keep the sums of the weights it made (the next
        version) and compare what waits for them; judge each sampler's log-prob gap at `batch.version`."""
        version = batch.version
        if self.checksum:
            if result.weight_sums:
                if (before := self.sent.get(version)) is not None:  # how far a sampler one version behind is
                    self.version_changes.append(
                        mismatch(result.weight_sums, {g: x for g, x, _ in before}, 0.0)[1]
                    )
                self.sent[version + 1] = result.weight_sums
                for old in [v for v in self.sent if v <= version + 1 - KEEP_VERSIONS]:
                    del self.sent[old]
                self._compare(version + 1)
            else:
                self._say("sent", "the learners report no weight sums")
        if self.gap:
            self._judge_gaps(version, result.logprob_gaps)
            for g in batch.groups:  # trained: who sampled them is no longer needed
                self.sampler_of.pop(g.request_id, None)

    # -- the checks -----------------------------------------------------------------------------------
    def _compare(self, version: int) -> None:
        sent = self.sent.get(version)
        if sent is None:
            return
        for sampler, v in [k for k in self.served if k[1] == version]:
            served = dict(self.served.pop((sampler, v)))
            self.judged.add((sampler, v))
            self.checked += 1
            cause, rel = mismatch(sent, served, self.cfg.checksum_tolerance)
            if cause is None:
                self.worst_match = max(self.worst_match, rel)
            self._verdict("checksum", sampler, v, cause)
        self.judged = {k for k in self.judged if k[1] > version - KEEP_VERSIONS}
        self.served = {k: s for k, s in self.served.items() if k[1] > version - KEEP_VERSIONS}

    def _judge_gaps(self, version: int, gaps: Sequence[tuple[int, int, float, int]]) -> None:
        per: dict[str, list[float]] = {}
        for rid, tokens, total, over in gaps:
            acc = per.setdefault(self.sampler_of.pop(rid, "an unknown sampler"), [0.0, 0.0, 0.0])
            acc[0] += tokens
            acc[1] += total
            acc[2] += over
        for sampler, (n, total_gap, past) in sorted(per.items()):
            if n < self.cfg.logprob_min_tokens:
                continue
            share = past / n
            cause = None
            if share > self.cfg.logprob_max_share:
                cause = (
                    f"{share:.1%} of its {int(n)} fresh tokens sampled at version {version} are more than "
                    f"{self.cfg.logprob_bound:g} nats from the learner's log-probs at that version "
                    f"(mean |gap| {total_gap / n:.3g}; checks.logprob_max_share={self.cfg.logprob_max_share:g})"
                )
            self._verdict("log-prob gap", sampler, version, cause)

    def _verdict(self, check: str, sampler: str, version: int, cause: str | None) -> None:
        key = (check, sampler)
        if cause is None:
            self.in_a_row[key] = 0
            return
        self.failures += 1
        n = self.in_a_row[key] = self.in_a_row.get(key, 0) + 1
        line = f"weight check ({check}): {sampler} at version {version}: {cause}"
        log.error("%s (%d in a row)", line, n)
        if self.cfg.max_failures and n >= self.cfg.max_failures:
            raise WeightCheckFailed(
                f"{line}; {n} {'versions' if check == 'checksum' else 'steps'} in a row "
                f"(checks.max_failures={self.cfg.max_failures}): {sampler} does not "
                "serve the weights the learner sent (a load that did nothing, stale or wrong weights). The run "
                "stops; checks.max_failures=0 only logs, checks.checksum / checks.logprob_gap=false turn a check off"
            )

    def _say(self, key: str, what: str) -> None:
        if key not in self._said:
            self._said.add(key)
            log.warning("checks.checksum cannot run: %s (said once)", what)


def mismatch(
    sent: Sequence[tuple[str, float, float]], served: dict[str, float], tolerance: float
) -> tuple[str | None, float]:
    """(why the served per-layer sums are not the sent ones, naming the worst layer, or None when every layer
    is within `tolerance` x its sent sum of |w|; the worst |served - sent| / sum of |w|, inf when a layer is
    missing or extra, NaN for NaN weights)."""
    names = {g for g, _, _ in sent}
    if extra := sorted(set(served) - names):
        return f"it serves layers the learner did not send: {extra}", math.inf
    worst, where = 0.0, ""
    for group, total, scale in sent:
        if group not in served:
            return f"its weights have no {group}", math.inf
        rel = abs(served[group] - total) / max(scale, 1e-30)
        if not rel <= worst:  # NaN (garbage weights) is the worst
            worst, where = rel, f"{group} sums to {served[group]:.9g}, the learner sent {total:.9g}"
        if math.isnan(worst):
            break
    if worst <= tolerance:
        return None, worst
    return f"{where} (off by {worst:.2g} of its sum of |w|; checks.checksum_tolerance={tolerance:g})", worst
