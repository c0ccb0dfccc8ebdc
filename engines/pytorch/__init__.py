"""The native engine: transformers weights, our own batched forward over a paged KV cache."""
