"""Paged KV-cache bookkeeping: which blocks of the engine's pool belong to which sequence."""
