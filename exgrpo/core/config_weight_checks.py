"""The `checks` section of the configuration: the run's checks of its own weights (`exgrpo.loop.weight_checks`).

A module of its own so `exgrpo.core.config_sections` stays short; every field's doc is the comment right above it,
which the settings reference (docs/config.md) reads, and its ranges are `exgrpo.core.config_checks.BOUNDS`'.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ChecksConfig:
    # after every weight load or update each sampler sums its served weights per layer (inside the engine);
    # the driver compares the sums with the learner's of the weights it sent for that version
    checksum: bool = True
    # a layer's served sum may differ from the sent one by this share of the sent layer's sum of |w| (measured
    # noise: docs/metrics.md, "Weight checks")
    checksum_tolerance: float = 1e-8
    # measure |learner log-prob - sampler log-prob| of the fresh tokens sampled at the learner's version (the
    # rollout/logprob_gap_* metrics; only at samplers.temperature=1 and top_p=1, where the two are comparable)
    logprob_gap: bool = True
    # a token's gap counts as past the bound above this (nats)
    logprob_bound: float = 0.5
    # a sampler fails the gap check at a step when more than this share of its compared tokens is past the
    # bound
    logprob_max_share: float = 0.05
    # fewest compared tokens of a sampler at a step for the gap check to judge it
    logprob_min_tokens: int = 32
    # checks a sampler may fail in a row (versions for the checksum, steps for the gap) before the run stops
    # naming it and the version (0 = never stop: the checks only log)
    max_failures: int = 3
