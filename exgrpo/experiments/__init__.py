"""Experiments: the ExGRPO vs GRPO comparison and the paper's ablations, in miniature."""
