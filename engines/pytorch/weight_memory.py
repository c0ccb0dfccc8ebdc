"""What the native engine holds for its weights: every tensor reachable from the model runner, each storage once.

Why: the point of serving a GGUF file from its blocks is memory (and the bytes each decode step streams); a float32
copy left behind anywhere (a module's parameter, a fallback kept "just in case", a view that pins a whole mapping)
would silently undo it. The engine logs the total at start, and the tests and bench/gguf_memory_bench.py check it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
LARGE = 1 << 20  # a float tensor this large is a weight (norms, biases and rotary tables are smaller)


@dataclass(frozen=True)
class Held:
    """A storage the runner holds: its bytes (the largest view of it), dtype and shape of that view."""

    nbytes: int
    dtype: torch.dtype
    shape: tuple[int, ...]


def held_tensors(root: Any, skip: tuple[Any, ...] = ()) -> dict[int, Held]:
    """Every CPU tensor reachable from `root` through attributes, slots, modules, lists and dicts, by storage
    address. A storage several views share counts once, by its largest view (tensors on huge pages are views into a
    mapping up to 2 MiB larger, never touched). `skip`: objects not to enter (the KV cache)."""
    found: dict[int, Held] = {}
    seen = {id(s) for s in skip}
    stack = [root]
    while stack:
        obj = stack.pop()
        if obj is None or id(obj) in seen or isinstance(obj, (str, bytes, int, float, bool, type)):
            continue
        seen.add(id(obj))
        if isinstance(obj, torch.Tensor):
            if obj.device.type == "cpu" and obj.numel():
                storage = obj.untyped_storage()
                size = min(obj.numel() * obj.element_size(), storage.nbytes())
                if size > found.get(storage.data_ptr(), Held(0, obj.dtype, ())).nbytes:
                    found[storage.data_ptr()] = Held(size, obj.dtype, tuple(obj.shape))
            continue
        if isinstance(obj, dict):
            stack.extend(obj.values())
            continue
        if isinstance(obj, (list, tuple, set, frozenset)):
            stack.extend(obj)
            continue
        if isinstance(obj, torch.nn.Module):
            stack.extend(obj.parameters(recurse=False))
            stack.extend(obj.buffers(recurse=False))
            stack.extend(obj.children())
        if type(obj).__module__.split(".")[0] in ("ctypes", "_ctypes", "torch", "builtins", "threading"):
            continue
        if hasattr(obj, "__dict__"):
            stack.extend(vars(obj).values())
        for cls in type(obj).__mro__:
            for name in getattr(cls, "__slots__", ()):
                stack.append(getattr(obj, name, None))
    return found


def runner_weights(runner: Any) -> dict[int, Held]:
    """The tensors a `PagedModelRunner` holds, its KV cache left out."""
    return held_tensors(runner, (runner.k_cache, runner.v_cache))


def float_weights(held: dict[int, Held]) -> list[Held]:
    """The weights among `held` kept in a float dtype (a megabyte or more)."""
    return [h for h in held.values() if h.dtype in FLOAT_DTYPES and h.nbytes >= LARGE]
