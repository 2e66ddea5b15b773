"""Held-out scores (Avg@n, Pass@n), a model's solve rates and trace validity, and the paper's evaluation
settings."""
