"""Block accounting of the KV pool and manager: sharing, LRU eviction of cached blocks, double frees."""

from __future__ import annotations

import pytest

from gateway.kv_cache.block_pool import BlockPool
from gateway.kv_cache.manager import KVCacheManager


def test_pool_allocate_free_and_double_free() -> None:
    pool = BlockPool(4)
    blocks = pool.allocate(3)
    assert pool.num_free == 1 and pool.num_used == 3
    with pytest.raises(RuntimeError):
        pool.allocate(2)
    pool.free(blocks)
    assert pool.num_free == 4
    with pytest.raises(RuntimeError):
        pool.free([blocks[0]])


def test_cached_blocks_are_evicted_last_and_lose_their_hash() -> None:
    pool = BlockPool(3)
    a, b, c = pool.allocate(3)
    pool.register(a, 111)
    pool.free([a, b, c])
    assert pool.lookup(111) == a
    got = pool.allocate(2)  # the two plain blocks go first
    assert a not in got and pool.lookup(111) == a
    pool.allocate(1)  # now the cached one is evicted
    assert pool.lookup(111) is None


def test_manager_shares_prefix_blocks_between_sequences() -> None:
    kv = KVCacheManager(num_blocks=8, block_size=2)
    tokens = [1, 2, 3, 4, 5]
    assert kv.admit("a", tokens) == 0
    assert kv.allocate("a", 5) is not None
    kv.commit("a", tokens, 5)
    assert kv.admit("b", tokens) == 4  # two full blocks shared
    assert kv.block_table("b")[:2] == kv.block_table("a")[:2]
    kv.allocate("b", 5)
    assert kv.pool.num_used == 4  # 3 for a, 1 new for b's tail
    kv.free("a")
    kv.free("b")
    assert kv.pool.num_used == 0 and kv.pool.num_cached == 2


def test_manager_allocate_is_all_or_nothing() -> None:
    kv = KVCacheManager(num_blocks=2, block_size=4)
    assert kv.allocate("a", 12) is None
    assert kv.block_table("a") == []
    assert kv.allocate("a", 8) is not None and kv.pool.num_free == 0
