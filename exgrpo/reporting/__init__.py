"""What a run reports: the console's phases and step bar, the metric loggers (jsonl, TensorBoard, W&B, Ray
gauges), samples.jsonl and the end-of-run report (docs/metrics.md)."""
