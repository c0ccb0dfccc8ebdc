"""The vLLM engine adapter: vLLM's `AsyncLLM` in-process (install the `vllm` extra; imported only when used)."""
