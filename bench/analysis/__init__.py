"""Analyses of finished compare sweeps for docs/results.md, each `python -m bench.analysis.<name>`:

- `regimes`: the regime table, one row per sweep cell (an arm against GRPO);
- `reach`: what replay did in each run (replays per question, ages, w*, buckets, rare successes);
- `heldout`: a held-out phase, paired over seeds, from each run's saved held-out completions;
- `probe`: the sweep's final models again, at T = 0.6 and on the questions replay chose;
- `figure1`: the paper's Figure 1 in miniature (trace validity against token entropy); `sweeps`: what they share.
"""
