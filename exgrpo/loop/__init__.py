"""The training loop, typed by the roles of `exgrpo.core.roles` only: the driver, slot 0 of the replay groups, a
step's plan and metrics, observers, checkpoints and resume checks; no Ray."""
