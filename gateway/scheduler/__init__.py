"""Schedulers: `llm/` for LLMs (continuous batching, admission), `tensor/` for Triton's tensor batchers."""
