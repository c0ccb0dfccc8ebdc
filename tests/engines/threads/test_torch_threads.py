"""What torch's thread count really is per thread (engines/torch_threads.py): with the OpenMP backend a thread that
set 1 keeps running its ops on one thread while another thread runs its own on 3 (its OpenMP team: new OS
threads), and a fresh thread takes the last count set anywhere (so each model's thread sets its own)."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator

import pytest
import torch

from engines.torch_threads import TorchThreads, use_torch_threads


def os_threads() -> int:
    return len(os.listdir("/proc/self/task"))


def work() -> None:
    a = torch.randn(384, 384)
    for _ in range(3):
        torch.mm(a, a)
        torch.randn(1 << 20).exp_()  # an elementwise op over torch's own parallel_for


def on_thread(fn: Callable[[], None]) -> None:
    thread = threading.Thread(target=fn)
    thread.start()
    thread.join()


@pytest.fixture(autouse=True)
def restore() -> Iterator[None]:
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)  # the default fresh threads take, for the tests after these


@pytest.mark.skipif(not torch.backends.openmp.is_available(), reason="torch built without OpenMP")
def test_each_thread_runs_its_ops_on_its_own_count() -> None:
    seen: dict[str, int] = {}
    one_set, three_done, single_done = threading.Event(), threading.Event(), threading.Event()

    def single() -> None:
        seen["single"] = use_torch_threads(1)
        work()
        one_set.set()
        three_done.wait(60)
        before = os_threads()
        work()
        seen["single_after"], seen["single_new"] = torch.get_num_threads(), os_threads() - before
        single_done.set()

    def three() -> None:
        one_set.wait(60)
        shared = TorchThreads(3)
        before = os_threads()
        shared.enter()
        work()
        seen["three"], seen["three_new"] = shared.seen, os_threads() - before
        three_done.set()
        single_done.wait(60)  # its team stays while the other thread counts

    workers = [threading.Thread(target=single), threading.Thread(target=three)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert (seen["single"], seen["three"], seen["single_after"]) == (1, 3, 1)
    assert seen["three_new"] >= 2  # its ops ran on a team of 3: two OS threads joined the process
    assert seen["single_new"] == 0  # the thread at 1 never started a team

    fresh: dict[str, int] = {}
    on_thread(lambda: fresh.update(n=torch.get_num_threads()))
    assert fresh["n"] == 3  # the process-wide default: the last count set, by any thread
