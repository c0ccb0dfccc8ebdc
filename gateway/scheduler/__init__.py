"""Schedulers: the LLM sequence batcher (continuous batching) and, later, the v2 dynamic batcher."""
