"""The building blocks a decoder family is made of (models/ puts them together; the runner drives them).

- `norms.py`: RMSNorm, including Gemma's (1 + w) scale, for the C kernel or transformers' torch ops;
- `rotary.py`: the rotary tables of a step (default, linear, llama3, yarn, LongRoPE: transformers' own tables);
- `projections.py`: the fused projections (q/k/v, gate/up) from separate or already fused weights and GGUF blocks;
- `attention.py`: a decoder's attention block over the paged KV cache (C kernels, or torch ops for sliding windows
  and soft-capping), and the `StepContext` a layer sees of the step;
- `mlp.py`: the MLP slot (`MLP`) and the gated dense MLP that fills it (SiLU, GELU-tanh);
- `moe.py`: the sparse mixture-of-experts block that fills it for Qwen3-MoE, Mixtral and gpt-oss (router, experts);
- `swiglu.py`: gpt-oss's clamped SwiGLU.
"""
