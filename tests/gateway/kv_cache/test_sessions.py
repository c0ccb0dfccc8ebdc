"""KV sessions: pins, their count and their release."""

from gateway.kv_cache.block_pool import BlockPool
from gateway.kv_cache.sessions import SessionStore


def test_blocks_shared_by_two_sessions_count_once() -> None:
    """The gauge is memory held: two conversations with one system prompt pin its blocks once."""
    pool = BlockPool(8)
    store = SessionStore(pool, ttl_seconds=60, max_pinned_blocks=8)
    shared = pool.allocate(2)
    store.pin("a", shared)
    store.pin("b", shared)
    assert store.pinned_blocks == 2
    store.release("a")
    assert store.pinned_blocks == 2
    store.release("b")
    assert store.pinned_blocks == 0
