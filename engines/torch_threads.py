"""Torch's intra-op thread count for the work of one model, set on the OS thread that runs it.

`torch.set_num_threads` looks process-wide but, with the OpenMP backend torch's CPU wheels use, what it changes is
per thread (measured, tests/engines/test_torch_threads.py): it sets the calling thread's OpenMP `nthreads` (and
MKL's thread-local count), which that thread's parallel regions read, so a thread at 1 stays at 1 while another
thread runs its ops on 4 (each OpenMP master thread gets its own team of workers). What is process-wide is the
default that a thread takes on its first torch op: the last value set by any thread. So every thread that runs a
model's torch work sets its own count (`use_torch_threads`) rather than trusting the default: the native engine's
step thread (1, its kernels run on their own helpers) and each tensor model's batch thread (its CPU share).
Setting the count again to the value it has is skipped: changing it also resizes torch's pthreadpool.
"""

from __future__ import annotations


def use_torch_threads(threads: int) -> int:
    """Run this thread's torch ops on `threads` intra-op threads from now on; returns the count torch reports for
    this thread afterwards (what its ops run with)."""
    import torch

    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
    return torch.get_num_threads()


class TorchThreads:
    """A model instance's share of threads for its torch work (`share`) and the count torch last ran its work with
    on the thread that ran it (`seen`, 0 before any; exported as switchyard_model_torch_threads)."""

    def __init__(self, share: int) -> None:
        self.share = max(1, share)
        self.seen = 0

    def enter(self) -> None:
        """Before a batch, on the thread that runs it."""
        self.seen = use_torch_threads(self.share)
