"""The training loop, typed by the roles of `exgrpo.core.roles` only: the driver, its scheduler (admission,
requests, pulls) and update pipeline (the updates in flight), slot 0 of the replay groups, a step's plan, timings
and metrics, observers, checkpoints and resume checks; no Ray."""
