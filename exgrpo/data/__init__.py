"""Data: readers (parquet, jsonl), builtin tasks, prompt templates and the prompt stream."""
