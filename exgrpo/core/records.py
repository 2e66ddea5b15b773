"""Typed records that cross process boundaries.

Every object sent between the driver, samplers, replay shards and learners is one of these small
frozen dataclasses (or an Arrow table built from them), never a loose dict. Every trajectory
carries the policy version that produced it: `policy_version` is the oldest version among its tokens,
and a trajectory whose weights changed while it was generated (the continuous sampler's in-flight
updates) lists the versions of its token ranges in `version_spans`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

GroupKind = Literal["fresh", "replay"]
# how a replayed question's stored trajectory is chosen for slot 0 (`exgrpo.core.selection.fill_slots`)
Selection = Literal["lowest_entropy", "highest_entropy", "random"]
SELECTIONS: tuple[Selection, ...] = ("lowest_entropy", "highest_entropy", "random")


# A reward above this counts as a correct answer everywhere: the k-of-K buckets, `rollout/solve_ratio`, the
# held-out Pass@n, and `python -m exgrpo.evaluate --correct-above`'s default (docs/metrics.md, "Held-out scores").
CORRECT_ABOVE = 0.5


@dataclass(frozen=True)
class Prompt:
    """One training or evaluation question with its reference answer."""

    qid: str  # stable question id (used for replay routing and retirement)
    question: str  # the question text, before any chat template
    answer: str  # the gold answer (LaTeX or plain text), e.g. "\\frac{1}{2}"
    data_source: str = "default"  # dataset name, for per-source evaluation tables
    fields: dict[str, Any] = field(
        default_factory=dict, hash=False
    )  # the row's other columns (for reward.fn)


@dataclass(frozen=True)
class Trajectory:
    """One sampled response to a question, with its reward and behaviour log-probs."""

    qid: str
    response_ids: tuple[int, ...]  # generated token ids (response only, no prompt)
    logprobs: tuple[float, ...]  # behaviour log-prob of each response token, same length
    reward: float  # 1.0 if the final answer verified, else 0.0
    policy_version: int  # learner version of the weights that sampled it (the oldest, if several did)
    replayed: bool = False  # True for the stored trajectory placed in slot 0 of a mixed group
    text: str = ""  # decoded response (for logs and debugging; not used by the loss)
    group_id: str = ""  # id of the group that produced it (candidates exclude the same group)
    # (first token index, version) per token range, when the weights changed mid-response: tokens
    # [start_i, start_{i+1}) were sampled by version_i. Empty: every token by `policy_version`.
    version_spans: tuple[tuple[int, int], ...] = ()

    def __post_init__(self) -> None:
        if len(self.response_ids) != len(self.logprobs):
            raise ValueError(
                f"Trajectory {self.qid!r}: {len(self.response_ids)} response ids but "
                f"{len(self.logprobs)} log-probs; they must have the same length"
            )
        if self.version_spans:
            starts = [s for s, _ in self.version_spans]
            versions = [v for _, v in self.version_spans]
            if (
                starts[0] != 0
                or any(b <= a for a, b in zip(starts, starts[1:], strict=False))
                or starts[-1] >= max(len(self.response_ids), 1)
                or any(b < a for a, b in zip(versions, versions[1:], strict=False))
                or versions[0] != self.policy_version
            ):
                raise ValueError(
                    f"Trajectory {self.qid!r}: version_spans {self.version_spans} must start at token 0 with "
                    f"policy_version={self.policy_version} (the oldest), with increasing starts inside the "
                    f"{len(self.response_ids)} tokens and non-decreasing versions"
                )

    @property
    def oldest_version(self) -> int:
        """The oldest policy version among its tokens (what staleness counts)."""
        return self.version_spans[0][1] if self.version_spans else self.policy_version

    def token_versions(self) -> tuple[int, ...]:
        """The policy version that sampled each response token."""
        if not self.version_spans:
            return (self.policy_version,) * len(self.response_ids)
        ends = [s for s, _ in self.version_spans[1:]] + [len(self.response_ids)]
        return tuple(v for (s, v), e in zip(self.version_spans, ends, strict=True) for _ in range(s, e))

    @property
    def correct(self) -> bool:
        return self.reward > CORRECT_ABOVE


@dataclass(frozen=True)
class Group:
    """The rollouts of one question produced by one generation request.

    A fresh group holds K rollouts. A replay group holds K - 1 fresh rollouts plus the stored
    candidate trajectories its request carried (pinned when the question was sampled, so never from
    this group); the driver picks one (lowest entropy) and puts it in slot 0 with replayed=True.
    """

    qid: str
    prompt_ids: tuple[int, ...]
    trajectories: tuple[Trajectory, ...]
    kind: GroupKind = "fresh"
    gold: str = ""
    group_id: str = ""
    request_id: int = -1  # driver-assigned, increasing in issue order
    policy_version: int = 0  # version of the weights that sampled the fresh rollouts (the oldest of them)
    admitted_version: int = 0  # learner version when the driver admitted the request
    candidates: tuple[Trajectory, ...] = ()  # replay groups: stored correct trajectories

    @property
    def num_correct(self) -> int:
        """k for the question statistics; a replayed slot (correct by construction) counts."""
        k = sum(t.correct for t in self.trajectories)
        if self.kind == "replay" and not any(t.replayed for t in self.trajectories):
            k += 1  # the stored trajectory that will fill slot 0
        return k

    @property
    def oldest_version(self) -> int:
        """The oldest policy version among the fresh rollouts' tokens (the replayed slot 0 excluded)."""
        return min(
            (t.oldest_version for t in self.trajectories if not t.replayed), default=self.policy_version
        )

    @property
    def group_size(self) -> int:
        """K: fresh rollouts plus the replay slot."""
        extra = 1 if self.kind == "replay" and not any(t.replayed for t in self.trajectories) else 0
        return len(self.trajectories) + extra


@dataclass(frozen=True)
class GenerationRequest:
    """A driver's request to a sampler: n rollouts of one question."""

    request_id: int  # driver-assigned, increasing in issue order; the key of every later hop
    prompt: Prompt
    n: int  # K for fresh questions, K - 1 for replayed ones
    kind: GroupKind = "fresh"
    admitted_version: int = 0
    candidates: tuple[Trajectory, ...] = ()  # replay: the stored trajectories pinned at sampling time


@dataclass(frozen=True)
class RolloutResult:
    """What a sampler reports for one generate call (its groups went to Replay before this)."""

    sampler: str
    request_ids: tuple[int, ...]
    policy_version: int  # weights version that sampled the groups
    tokens: int  # generated tokens
    gen_time_s: float
    verify_time_s: float
    groups: tuple[Group, ...] = ()  # only when the sampler has no Replay to push to (tests, tools)
    reward_failures: int = 0  # rewards that timed out or whose function raised (each scored 0)
    # the first failure of each kind this sampler saw, sent once: (kind, its text with the row's qid)
    reward_failure_notes: tuple[tuple[str, str], ...] = ()
    # the per-layer sums of the weights this sampler served at `policy_version`, taken inside its engine right
    # after that version's load (`exgrpo.loop.weight_checks`); empty when `checks.checksum` is off
    served_sums: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True)
class ReplayPick:
    """A question drawn for replay, with the candidates stored for it when it was drawn."""

    qid: str
    candidates: tuple[Trajectory, ...]


@dataclass(frozen=True)
class ReplayCandidate:
    """A stored trajectory offered for a replayed question, with its prompt for scoring."""

    qid: str
    prompt_ids: tuple[int, ...]
    trajectory: Trajectory


@dataclass(frozen=True)
class ReplayStats:
    """What the replay service reports for metrics and scheduling."""

    bucket_sizes: dict[int, int]  # sampleable questions per bucket k
    active: int  # sampleable questions (bucket 1..K-1 with a stored trajectory)
    retired: int  # questions solved K/K (never replayed again)
    trajectories: int  # stored correct trajectories
    ready: int  # finished groups waiting to be pulled


@dataclass(frozen=True)
class PulledBatch:
    """The groups `pull_batch` took, the replay requests it refused, and the replay stats after it."""

    groups: tuple[Group, ...]
    dropped: tuple[int, ...]  # replay request ids whose question retired in flight (never replayed)
    stats: ReplayStats


@dataclass(frozen=True)
class TrainBatch:
    """One learner step's groups (shuffled): fresh groups and mixed groups (slot 0 replayed)."""

    groups: tuple[Group, ...]
    version: int  # learner version the batch is trained at
    clip: bool = True  # PPO clipping on fresh tokens (removed from the step after the delayed start)
    # None: every replay group's slot 0 is filled. Otherwise replay groups still carry their candidates; the
    # learners pick one per group (`exgrpo.core.selection.fill_slots`: by entropy under the weights at the
    # update's turn, or "random" from `select_seed`), fill slot 0 and train on that
    select: Selection | None = None
    select_seed: int = 0  # the seed of "random" selection (each group draws from (seed, request id))
    # with "random": score every candidate anyway (a trace check logs each one's entropy beside its validity)
    score_candidates: bool = False
    # the weight checks (`exgrpo.loop.weight_checks`): the log-prob gap's bound (None: the gap is not measured)
    # and whether rank 0 sums the weights the update makes, per layer
    gap_bound: float | None = None
    weight_sums: bool = False

    def __post_init__(self) -> None:
        if self.select is not None and self.select not in SELECTIONS:
            raise ValueError(f"select={self.select!r}; choose one of {SELECTIONS} or None")


@dataclass(frozen=True)
class UpdateResult:
    """What one learner update returns: its `learner/` metrics and, for a batch with `select`, which candidate
    filled slot 0 of each replay group (`picks`: `place_picks(batch.groups, picks)` gives the groups it trained
    on) and the entropy of every candidate it scored (replay groups in order, then each one's candidates in
    order; empty under "random", which scores nothing)."""

    metrics: dict[str, float]
    entropies: tuple[float, ...] = ()
    picks: tuple[int, ...] = ()  # per replay group, in batch order: the index of its chosen candidate
    # with `batch.weight_sums`: (layer, sum, sum of |w|) of the weights this update made (rank 0's), what the
    # samplers are sent for version `batch.version + 1`
    weight_sums: tuple[tuple[str, float, float], ...] = ()
    # with `batch.gap_bound`: per request, (request id, compared tokens, sum of |gap|, tokens past the bound)
    # of its fresh tokens sampled at `batch.version`
    logprob_gaps: tuple[tuple[int, int, float, int], ...] = ()
