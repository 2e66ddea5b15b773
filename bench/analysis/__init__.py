"""Analyses of finished compare sweeps for docs/results.md, each `python -m bench.analysis.<name>`:

- `regimes`: the regime table (a row per sweep cell); `reach`: what replay did in each run;
- `curves`: evaluation curves with seed bands, and each arm minus a base arm over steps;
- `heldout`: a held-out phase, paired over seeds, from each run's saved held-out completions;
- `probe`: the sweep's final models again, at T = 0.6 and on the questions replay chose;
- `figure1`: the paper's Figure 1 in miniature (trace validity against token entropy); `sweeps`: what they share.
"""
