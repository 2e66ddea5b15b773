"""A job on Ray: start-up, building and wiring the actors, the checks before a start, the training recipe and
its in-job recovery, the resource and memory plans, the scaling controller."""
