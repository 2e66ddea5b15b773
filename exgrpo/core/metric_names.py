"""Metric names (a documented contract, see docs/metrics.md), the JSONL log and Ray metrics.

Keys are namespaced `rollout/`, `replay/`, `learner/`, `system/`, `eval/`. Every step's record is
one JSON line in `<run_dir>/metrics.jsonl`; the same figures are exported through
`ray.util.metrics` as gauges named `exgrpo_<namespace>_<name>` (e.g. `exgrpo_rollout_mean_reward`)
so they show in the Ray dashboard's Metrics view / Prometheus (as `ray_exgrpo_*`, labelled with the
run's `run_id`; deploy/grafana charts them). `MetricsLogger` is the run's one logger: the same
records also go to TensorBoard and W&B when `logging.backends` lists them (exgrpo/reporting/loggers.py).
"""

from __future__ import annotations

import re

STEP = "step"
# rollout/
MEAN_REWARD = "rollout/mean_reward"  # mean reward of this step's fresh rollouts
SOLVE_RATIO = "rollout/solve_ratio"  # fraction of correct responses in this step's fresh groups
TOKENS = "rollout/tokens"  # tokens generated for this step's batch
TOKENS_PER_S = "rollout/tokens_per_s"  # generated tokens per wall second since the last step
GROUPS_PER_S = "rollout/groups_per_s"  # finished groups per wall second since the last step
RESPONSE_LEN = "rollout/response_len"  # mean response length (tokens) in the batch
REWARD_FAILURES = "rollout/reward_failures"  # rewards that timed out or whose reward.fn raised (scored 0)
ROLLOUTS = "rollout/rollouts"  # rollouts sampled and scored for this step (the replayed slot excluded)
REWARD_FAILURE_SHARE = "rollout/reward_failure_share"  # reward_failures / rollouts
ZERO_VARIANCE_FRAC = (
    "rollout/zero_variance_frac"  # fraction of groups whose rewards are all equal (no signal)
)
FRESH_ZERO_VARIANCE_FRAC = (
    "rollout/fresh_zero_variance_frac"  # the same over fresh groups only (what new data offers)
)
# the weight checks (checks.logprob_gap, T = 1 and top_p = 1 only): |learner - sampler log-prob| of the fresh
# tokens sampled at the learner's version, from the learner's log-probs at the update's start (summed over ranks)
LOGPROB_GAP_MEAN = "rollout/logprob_gap_mean"  # mean |gap| (nats)
LOGPROB_GAP_P99 = "rollout/logprob_gap_p99"  # 99th percentile of |gap| (histogram bin's upper edge)
LOGPROB_GAP_OVER = "rollout/logprob_gap_over"  # share of the compared tokens past checks.logprob_bound
LOGPROB_GAP_TOKENS = "rollout/logprob_gap_tokens"  # tokens compared (0: none was sampled at that version)
LOGPROB_GAP_KEYS = frozenset({LOGPROB_GAP_MEAN, LOGPROB_GAP_P99, LOGPROB_GAP_OVER, LOGPROB_GAP_TOKENS})
# replay/
REPLAY_STARTED = "replay/started"  # 1 once the delayed start has switched replay on
REPLAY_SIZE = "replay/size"  # questions that can be replayed (bucket 1..K-1 with a stored trajectory)
REPLAY_BUCKET = "replay/bucket_{k}"  # questions in bucket k
RETIRED = "replay/retired"  # questions solved K/K, retired for good
TRAJECTORIES = "replay/trajectories"  # stored correct trajectories
N_REPLAY = "replay/n_replay"  # replayed groups in this step's batch
N_FRESH = "replay/n_fresh"  # fresh groups in this step's batch
REPLAY_AVAILABLE = "replay/available"  # replayable questions when this step was scheduled
CHOSEN_VALID = "replay/chosen_valid_frac"  # replayed slot-0 trajectories whose trace is fully valid (tasks with a process check)
CANDIDATES_VALID = "replay/candidates_valid_frac"  # the same over all candidates scored this step
REPLACED = "replay/replaced"  # replay requests whose question retired in flight, re-issued as fresh
# learner/ (reported by every rank; averaged over ranks except LEARNER_TOKENS, which is summed)
LOSS = "learner/loss"  # total loss (policy gradient - entropy bonus)
PG_LOSS = "learner/pg_loss"  # policy-gradient part of the loss
ENTROPY = "learner/entropy"  # mean token entropy of the batch under the current weights
CLIP_FRAC = "learner/clip_frac"  # fraction of fresh tokens whose ratio was clipped
RATIO_FRESH = "learner/ratio_fresh"  # mean importance ratio on fresh tokens
RATIO_REPLAY = "learner/ratio_replay"  # mean importance ratio on replayed tokens (vs stored behaviour)
APPROX_KL = "learner/approx_kl"  # approximate KL(old || new) on fresh tokens
GRAD_NORM = "learner/grad_norm"  # gradient norm before clipping
SKIPPED_STEPS = "learner/skipped_steps"  # optimiser steps skipped (non-finite or huge grad norm)
CLIPPED_STEPS = (
    "learner/clipped_steps"  # optimiser steps whose grad norm exceeded learners.grad_clip (scaled down)
)
# learner/ diagnostics every learners.grad_share_every steps: the policy gradient split by row origin
GRAD_NORM_PG = "learner/grad_norm_pg"  # norm of the policy-gradient part alone (no entropy bonus)
GRAD_NORM_STORED = "learner/grad_norm_stored"  # ... of the stored trajectories in slot 0 of replay groups
GRAD_NORM_REPLAY_FRESH = "learner/grad_norm_replay_fresh"  # ... of the fresh rollouts of replay groups
GRAD_NORM_FRESH = "learner/grad_norm_fresh"  # ... of the rollouts of fresh groups
GRAD_SHARE_STORED = "learner/grad_share_stored"  # <g_stored, g> / |g|^2: its share of the gradient along g
GRAD_SHARE_REPLAY_FRESH = (
    "learner/grad_share_replay_fresh"  # the same for the fresh rollouts of replay groups
)
GRAD_SHARE_FRESH = "learner/grad_share_fresh"  # the same for fresh groups (the three shares sum to 1)
KL = "learner/kl"  # k3 KL(current || initial policy) of the trained tokens (only with loss.kl_coef > 0)
LEARNER_TOKENS = "learner/tokens"  # trained response tokens (summed over ranks)
LEARNER_UPDATE_TIME = "learner/update_time_s"  # a rank's time inside update
LEARNER_SELECT_TIME = "learner/select_time_s"  # a rank's time scoring and picking replay candidates
# system/
VERSION = "system/policy_version"  # learner version after this step
STALENESS_MEAN = "system/staleness_mean"  # mean (training version - sampling version) over the batch
STALENESS_MAX = "system/staleness_max"  # max of the same; never above async.max_staleness
STEP_TIME = "system/step_time_s"  # wall time of the step
WAIT_TIME = "system/wait_s"  # waiting for the step's generations
UPDATE_TIME = "system/update_s"  # learner update
UPDATE_GAP = (
    "system/update_gap_s"  # learners without an update: the previous one seen finished -> this one started
)
SYNC_TIME = "system/sync_s"  # weight export + broadcast issue on the driver side
IDLE_TIME = "system/idle_s"  # everything else (scheduling, pulling, logging)
WEIGHT_LOAD = "system/weight_load_s"  # mean time a sampler took to apply new weights (last finished loads)
SAMPLERS = "system/samplers"  # live sampler actors
SAMPLER_RESTARTS = "system/sampler_restarts"  # samplers replaced after a failure
RECOVERIES = "system/recoveries"  # in-job recoveries of this job so far (trainer.max_failures)
SAMPLERS_TARGET = (
    "system/samplers_target"  # sampler count the run aims for: the operator's or samplers.autoscale's
)
SAMPLERS_LIVE = "system/samplers_live"  # samplers taking requests now (started, not draining)
SAMPLERS_BLOCKED = (
    "system/samplers_blocked"  # share of the samplers' time with nothing to do (the staleness bound)
)
SAMPLER_PREEMPTIONS = (
    "system/sampler_preemptions"  # samplers lost to a drained or vanished node (not failures)
)
# eval/
EVAL_ACCURACY = "eval/accuracy"  # held-out Avg@n (mean reward over samples and questions)
EVAL_PASS = "eval/pass_at_n"  # held-out Pass@n
EVAL_VERSION = "eval/version"  # policy version the evaluation used
EVAL_ACCURACY_SOURCE = "eval/accuracy_{source}"  # Avg@n per data_source when the eval set has several

# keys present only in some records (evaluation steps; batches with replay groups and a process check)
GRAD_SHARE_KEYS = frozenset(
    {
        GRAD_NORM_PG,
        GRAD_NORM_STORED,
        GRAD_NORM_REPLAY_FRESH,
        GRAD_NORM_FRESH,
        GRAD_SHARE_STORED,
        GRAD_SHARE_REPLAY_FRESH,
        GRAD_SHARE_FRESH,
    }
)
# keys only some records carry: evaluations, process checks, the gradient split (learners.grad_share_every),
# the KL penalty (loss.kl_coef > 0), the log-prob gap (checks.logprob_gap at T = 1 and top_p = 1)
OPTIONAL_KEYS = (
    frozenset({EVAL_ACCURACY, EVAL_PASS, EVAL_VERSION, CHOSEN_VALID, CANDIDATES_VALID, KL})
    | GRAD_SHARE_KEYS
    | LOGPROB_GAP_KEYS
)

_NAME_RE = re.compile(r"[^a-zA-Z0-9_]")


def metric_safe(name: str) -> str:
    """A data source or other free name as a metric-name part: `scratchpad-id` -> `scratchpad_id`."""
    return _NAME_RE.sub("_", name)


def prometheus_name(key: str) -> str:
    return "exgrpo_" + _NAME_RE.sub("_", key)
