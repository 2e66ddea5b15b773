"""Analyses of finished compare sweeps (`python -m exgrpo.experiments.compare`), the tables and figures of
docs/results.md, each run as `python -m bench.analysis.<name>`:

- `regimes`: the regime table, one row per sweep cell (an arm against GRPO);
- `reach`: what replay did in each run (replays per question, trajectory ages, w*, buckets);
- `heldout`: the held-out phase, paired over seeds, from each run's saved held-out completions;
- `probe`: the sweep's final models again, at T = 0.6 and on the questions replay chose;
- `figure1`: the paper's Figure 1 in miniature (trace validity against token entropy);
- `sweeps`: the command line they share.
"""
