"""The dense layers' elementwise work beside the projections: RMSNorm (with the residual add, per head), the
gated activations' act(gate) * up, the logit soft-cap and Granite's multipliers, on csrc/gemm.c's kernels where
they give torch's bits (or within a few ulp), else transformers' own ops."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F

from engines.pytorch.gemm_library import _avx2, _load
from engines.pytorch.native import HelperThreads

SHARE_MIN_ELEMENTWISE_ROWS = 128  # norms and activations of fewer rows take less than waking a helper
HEAD_NORM_KERNEL_ROWS = 64  # per-head norms of steps up to this many rows: one kernel call a row (DenseOps)


def _is_silu(act: torch.nn.Module) -> bool:
    # transformers' ACT2FN["silu"] is its own SiLUActivation (F.silu) rather than torch.nn.SiLU
    return isinstance(act, torch.nn.SiLU) or type(act).__name__ == "SiLUActivation"


def _is_gelu_tanh(act: torch.nn.Module) -> bool:
    # transformers' ACT2FN["gelu_pytorch_tanh"] (Gemma's hidden_activation): F.gelu(approximate="tanh"), unless built
    # with its Python formula
    inner = getattr(act, "act", None)
    return (
        type(act).__name__ in ("GELUTanh", "PytorchGELUTanh")
        and getattr(inner, "keywords", {}).get("approximate") == "tanh"
    )


class DenseOps:
    """RMSNorm and SiLU-and-multiply of the dense layers (and, in float32, Gemma-like layers' RMSNorm with the
    residual add, per-head RMSNorm, GELU-tanh-and-multiply and the logit soft-cap; Granite's scaled residual add and
    logit division): C kernels when the GEMM kernel is in use (rows shared with the helper threads on steps of
    SHARE_MIN_ELEMENTWISE_ROWS or more), else what transformers computes (`module(x)`, `act(gate) * up`). The
    RMSNorm kernels give transformers' bits in float32 and bfloat16 (torch's order for the mean's sum), and so do
    bfloat16 SiLU-and-multiply (torch's exp_u20) and Granite's multipliers; float32 SiLU uses our exp and GELU-tanh
    and the soft-cap our tanh (within a few ulp of torch's)."""

    def __init__(
        self, fast: bool, dtype: torch.dtype, cache_dir: Path | None, helpers: HelperThreads | None = None
    ) -> None:
        usable = fast and dtype in (torch.float32, torch.bfloat16) and _avx2()
        lib = _load(cache_dir) if usable else None
        self._lib, self._dtype = lib, dtype
        f32 = dtype == torch.float32
        self._rms_kernel = None if lib is None else "rms_norm_f32" if f32 else "rms_norm_bf16"
        self._silu_kernel = (
            None
            if lib is None
            else "silu_mul_f32"
            if f32
            else ("silu_mul_bf16" if lib.exact_silu_bf16() == 1 else None)
        )  # bfloat16: only where it gives torch's bits
        # float32 only: GELU-tanh and the kernels of Gemma-like layers (within a few ulp of torch's tanh, like SiLU)
        self._f32 = lib is not None and f32
        self._share = helpers is not None and lib is not None
        if self._share:
            helpers.attach(lib)

    @property
    def uses_kernel(self) -> bool:
        return self._lib is not None

    def _run(self, name: str, m: int, *args: object) -> None:
        if self._share and m >= SHARE_MIN_ELEMENTWISE_ROWS:
            getattr(self._lib, f"{name}_par")(*args)
        else:
            getattr(self._lib, name)(*args, None)

    def rms_norm(self, module: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
        if self._rms_kernel is None or x.dtype != self._dtype or module.weight.dtype != x.dtype:
            if x.dtype == torch.float32:  # bit for bit transformers' float32 RMSNorm, in one op
                return F.rms_norm(x, module.weight.shape, module.weight, module.variance_epsilon)
            return module(x)
        if x.stride(-1) != 1:
            x = x.contiguous()
        m, h = x.shape
        y = x.new_empty(m, h)
        self._run(
            self._rms_kernel,
            m,
            x.data_ptr(),
            x.stride(0),
            module.weight.data_ptr(),
            module.variance_epsilon,
            y.data_ptr(),
            h,
            m,
            h,
        )
        return y

    def rms_norm_add(self, module: torch.nn.Module, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """residual + norm(x): a block's output norm and the residual add after it, one kernel in float32."""
        if not self._f32 or x.dtype != torch.float32 or module.weight.dtype != x.dtype or residual.stride(-1) != 1:
            return residual + self.rms_norm(module, x)
        if x.stride(-1) != 1:
            x = x.contiguous()
        m, h = x.shape
        y = x.new_empty(m, h)
        w, eps = module.weight.data_ptr(), module.variance_epsilon
        self._run("rms_norm_add_f32", m, x.data_ptr(), x.stride(0), w, eps, residual.data_ptr(), residual.stride(0),
                  y.data_ptr(), h, m, h)  # fmt: skip
        return y

    def rms_norm_heads(self, module: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
        """`module(x)` over each head of x [T, heads, D] (per-head q/k norms: Qwen3, Gemma 3; a row's heads are D
        apart, rows the projection's stride apart), so that a decode step's q/k norms are kernel calls the step
        replay records: in float32 one call for every head of every row (`rms_norm_heads_f32`); in bfloat16 one
        call per row of up to HEAD_NORM_KERNEL_ROWS rows, transformers' module on larger steps (the kernels give
        its bits either way)."""
        t, heads, d = x.shape
        if self._f32 and x.dtype == torch.float32 and module.weight.dtype == x.dtype and x.stride()[1:] == (d, 1):
            y = x.new_empty(t, heads, d)
            w, eps = module.weight.data_ptr(), module.variance_epsilon
            self._run("rms_norm_heads_f32", t * heads, x.data_ptr(), x.stride(0), w, eps, y.data_ptr(), heads * d,
                      t, heads, d)  # fmt: skip
            return y
        if (
            self._rms_kernel is None
            or x.dtype != self._dtype
            or module.weight.dtype != x.dtype
            or t > HEAD_NORM_KERNEL_ROWS
            or x.stride(2) != 1
        ):
            return module(x)
        y = x.new_empty(t, heads, d)
        w, eps = module.weight.data_ptr(), module.variance_epsilon
        for i in range(t):  # looked up each call: the step replay's recorder wraps the library's functions
            getattr(self._lib, self._rms_kernel)(
                x[i].data_ptr(), x.stride(1), w, eps, y[i].data_ptr(), d, heads, d, None
            )
        return y

    def softcap(self, x: torch.Tensor, cap: float) -> torch.Tensor:
        """tanh(x / cap) * cap (a final logit soft-cap), in place where the kernel runs."""
        if not self._f32 or x.dtype != torch.float32 or x.dim() != 2 or x.stride(-1) != 1:
            return torch.tanh(x / cap) * cap
        self._run("softcap_f32", x.shape[0], x.data_ptr(), x.stride(0), cap, x.shape[0], x.shape[1])
        return x

    def scale_add(self, x: torch.Tensor, scale: float, residual: torch.Tensor) -> torch.Tensor:
        """residual + x * scale (a block's output times Granite's residual multiplier, then the residual add), one
        kernel in float32 with torch's bits (the product rounded first)."""
        kernel = self._f32 and x.dtype == residual.dtype == torch.float32 and x.dim() == 2
        if not kernel or x.stride(-1) != 1 or residual.stride(-1) != 1:
            return residual + x * scale
        m, n = x.shape
        y = x.new_empty(m, n)
        self._run("scale_add_f32", m, x.data_ptr(), x.stride(0), scale, residual.data_ptr(), residual.stride(0),
                  y.data_ptr(), n, m, n)  # fmt: skip
        return y

    def divide(self, x: torch.Tensor, divisor: float) -> torch.Tensor:
        """x / divisor (Granite's `logits_scaling`), a true division as torch's; in place where the kernel runs."""
        if not self._f32 or x.dtype != torch.float32 or x.dim() != 2 or x.stride(-1) != 1:
            return x / divisor
        self._run("div_f32", x.shape[0], x.data_ptr(), x.stride(0), divisor, x.shape[0], x.shape[1])
        return x

    def act_mul(self, act: torch.nn.Module, gate_up: torch.Tensor) -> torch.Tensor:
        """act(gate) * up for gate_up = [gate | up] along the last dimension."""
        kernel = (
            self._silu_kernel if _is_silu(act) else "gelu_tanh_mul_f32" if self._f32 and _is_gelu_tanh(act) else None
        )
        if kernel is None or gate_up.dtype != self._dtype or gate_up.stride(-1) != 1:
            gate, up = gate_up.chunk(2, dim=-1)
            return act(gate) * up
        m, i2 = gate_up.shape
        y = gate_up.new_empty(m, i2 // 2)
        self._run(kernel, m, gate_up.data_ptr(), gate_up.stride(0), y.data_ptr(), i2 // 2, m, i2 // 2)
        return y
