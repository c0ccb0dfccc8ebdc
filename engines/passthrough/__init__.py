"""The `openai` backend: an OpenAI-compatible upstream used as it is (text in, text out, no local tokenizer)."""
