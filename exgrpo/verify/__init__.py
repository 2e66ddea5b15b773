"""Rewards: answer extraction and math-verify equivalence, run in worker processes with a hard deadline, or a
user's own reward function (docs/rewards.md)."""
