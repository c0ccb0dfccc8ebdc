"""Block accounting of the KV pool and manager: sharing, LRU eviction of cached blocks, double frees."""

from __future__ import annotations

import pytest

from gateway.kv_cache import prefix_cache
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
    pool.register(a, b"111", [1, 1, 1])
    pool.free([a, b, c])
    assert pool.lookup(b"111", [1, 1, 1]) == a
    got = pool.allocate(2)  # the two plain blocks go first
    assert a not in got and pool.lookup(b"111", [1, 1, 1]) == a
    pool.allocate(1)  # now the cached one is evicted
    assert pool.lookup(b"111", [1, 1, 1]) is None


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


def test_shared_blocks_of_a_step_in_flight_are_referenced_and_registered_by_their_writer() -> None:
    """A follower takes blocks its leader writes in the step being planned (not in the cache yet): it holds a
    reference to each, never registers them itself, and they outlive the leader; the leader's commit caches them."""
    kv = KVCacheManager(num_blocks=8, block_size=2)
    lead, follow = [1, 2, 3, 4, 5], [1, 2, 3, 4, 9, 9]
    kv.admit("a", lead)
    kv.allocate("a", 5)
    assert kv.admit("b", follow) == 0 and kv.share("b", kv.block_table("a")[:2]) == 4
    kv.allocate("b", 6)
    assert kv.block_table("b")[:2] == kv.block_table("a")[:2] and kv.pool.num_used == 4
    kv.commit("b", follow, 6)  # b's own block only: the shared ones are its writer's to offer
    assert kv.pool.num_cached == 1
    kv.commit("a", lead, 5)
    assert kv.num_cached_blocks([1, 2, 3, 4, 0]) == 2
    kv.free("a")
    assert kv.pool.num_used == 3  # b still holds the two it took
    kv.free("b")
    assert kv.pool.num_used == 0 and kv.prefix_stats.hit_tokens == 4


def test_manager_allocate_is_all_or_nothing() -> None:
    kv = KVCacheManager(num_blocks=2, block_size=4)
    assert kv.allocate("a", 12) is None
    assert kv.block_table("a") == []
    assert kv.allocate("a", 8) is not None and kv.pool.num_free == 0


def test_a_digest_registered_for_other_tokens_is_a_miss() -> None:
    pool = BlockPool(2)
    a, _ = pool.allocate(2)
    assert pool.register(a, b"h", [1, 2]) is True
    assert pool.lookup(b"h", [1, 2]) == a
    assert pool.lookup(b"h", [1, 3]) is None  # same digest, other tokens: never a hit


def test_digests_are_sha256_chained_over_the_whole_prefix() -> None:
    one = prefix_cache.prefix_hashes([1, 2, 3, 4], 2, 2)
    other = prefix_cache.prefix_hashes([9, 2, 3, 4], 2, 2)
    assert all(len(h) == 32 for h in one)  # 256 bits
    assert one[1] != other[1]  # the second block's digest names the first block too


def test_forced_hash_collision_misses(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every block digest collides: a prompt must still find only blocks that hold its own tokens."""
    monkeypatch.setattr(prefix_cache, "block_hash", lambda parent, tokens: b"collide")
    kv = KVCacheManager(num_blocks=16, block_size=2)
    first = [1, 2, 3, 4, 5]
    kv.admit("a", first)
    kv.allocate("a", 5)
    kv.commit("a", first, 5)
    assert kv.admit("b", [7, 8, 3, 4, 5]) == 0  # same digest as a's first block, other tokens: a miss
    assert kv.admit("c", [1, 2, 9, 9, 5]) == 2  # its first block is a's; its second collides but differs
    assert kv.block_table("c") == kv.block_table("a")[:1]


def test_session_pins_the_block_lookups_find_not_a_duplicate() -> None:
    """Two sequences computed the same prefix at once: the second's copy was refused by the cache, so what the
    second pins must be the first's block (the one a later lookup finds)."""
    kv = KVCacheManager(num_blocks=16, block_size=2)
    tokens = [1, 2, 3, 4, 5]
    for seq in ("a", "b"):
        assert kv.admit(seq, tokens) == 0
        kv.allocate(seq, 5)
    kv.commit("a", tokens, 5)
    kv.commit("b", tokens, 5)
    assert kv.block_table("a")[:2] != kv.block_table("b")[:2]
    assert kv.cached_blocks("b", tokens) == kv.block_table("a")[:2]
    kv.free("a")
    kv.pool.allocate(kv.pool.num_free)  # evict a's cached copies
    # b's own blocks take their place: pinned blocks are always ones a lookup finds
    assert kv.cached_blocks("b", tokens) == kv.block_table("b")[:2]
    assert kv.num_cached_blocks(tokens) == 2
