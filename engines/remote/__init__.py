"""The remote engine: a model served by one or more upstream OpenAI-compatible servers (scale-out, failover)."""
