"""The OpenAI-compatible frontend (/v1)."""
