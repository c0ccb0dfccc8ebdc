"""The TensorRT-LLM engine adapter, over its public `LLM` API (NVIDIA GPUs only; imported only when used)."""
