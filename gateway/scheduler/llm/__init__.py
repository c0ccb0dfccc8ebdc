"""LLM schedulers: the step policy and its async driver for step engines, admission for self-batching engines."""
