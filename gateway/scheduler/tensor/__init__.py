"""Triton's schedulers for tensor models: the dynamic batcher, the stateful sequence batcher, the rate limiter."""
