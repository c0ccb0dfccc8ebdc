"""Router: session affinity, cache-aware routing by the longest probably-cached prefix with its load bound, and
least-outstanding as the fallback. Pure routing decisions; the engine's use of them is in test_remote_engine.py."""

from __future__ import annotations

import random

import pytest

from engines.remote.prefix_index import PrefixIndex, block_chain
from engines.remote.routing import Router, RoutingSettings
from engines.remote.upstream import Upstream, UpstreamSettings


def router(n: int = 2, **settings: object) -> Router:
    return Router(
        [Upstream(UpstreamSettings(f"http://up-{i}:8000")) for i in range(n)],
        RoutingSettings(**{"block_tokens": 4, **settings}),
    )  # type: ignore[arg-type]


def tenant(seed: int, length: int = 64) -> list[int]:
    return random.Random(seed).choices(range(1000), k=length)


def test_a_prefix_goes_back_to_the_upstream_that_cached_it() -> None:
    r = router()
    a, b = tenant(1), tenant(2)
    first_a = r.pick(None, prompt=a + [7, 8])
    first_b = r.pick(None, prompt=b + [7, 8])
    assert first_a is not first_b  # unknown prefixes are spread by the least-outstanding fallback (rotation)
    for i in range(6):
        assert r.pick(None, prompt=a + [i, i + 1, i + 2]) is first_a
        assert r.pick(None, prompt=b + [i]) is first_b


def test_the_longest_cached_prefix_wins() -> None:
    r = router()
    base = tenant(3, 32)
    short = r.pick(None, prompt=base + tenant(4, 16))
    r.upstreams[0].outstanding = r.upstreams[1].outstanding = 0
    other = next(u for u in r.upstreams if u is not short)
    r.index.insert(other, block_chain(base + tenant(5, 32), 4))  # `other` holds a longer prefix of the next prompt
    assert r.pick(None, prompt=base + tenant(5, 32) + [1, 2]) is other


def test_a_prompt_mostly_uncached_falls_back_to_least_outstanding() -> None:
    r = router(cache_threshold=0.5)
    shared = tenant(6, 8)  # two blocks cached ...
    home = r.pick(None, prompt=shared)
    home.outstanding = 1
    away = next(u for u in r.upstreams if u is not home)
    assert r.pick(None, prompt=shared + tenant(7, 32)) is away  # ... of 40 tokens: under the threshold


def test_the_load_bound_moves_a_hot_prefix_to_the_least_busy_upstream_which_then_caches_it() -> None:
    r = router(balance_abs=2, balance_rel=1.5)
    hot = tenant(8)
    home = r.pick(None, prompt=hot)
    away = next(u for u in r.upstreams if u is not home)
    home.outstanding, away.outstanding = 3, 1  # 2 more and 3x as many: within the bound (not more than 2)
    assert r.pick(None, prompt=hot + [1]) is home
    home.outstanding = 4  # 3 more than the least busy and 4x as many: over it
    assert r.pick(None, prompt=hot + [2]) is away
    assert r.index.matched_tokens(away, block_chain(hot, 4)) == len(hot)
    home.outstanding, away.outstanding = 2, 1  # both hold it now: the less busy of them gets it
    assert r.pick(None, prompt=hot + [3]) is away


def test_the_relative_bound_lets_busy_pools_keep_their_prefixes() -> None:
    r = router(balance_abs=2, balance_rel=1.5)
    hot = tenant(9)
    home = r.pick(None, prompt=hot)
    away = next(u for u in r.upstreams if u is not home)
    home.outstanding, away.outstanding = 14, 10  # 4 more, but only 1.4x as many
    assert r.pick(None, prompt=hot) is home


def test_a_session_stays_on_its_upstream_whatever_is_cached() -> None:
    r = router()
    prompt = tenant(10)
    pinned = r.affinity("conversation-1")
    assert pinned is not None
    other = next(u for u in r.upstreams if u is not pinned)
    r.index.insert(other, block_chain(prompt, 4))
    for _ in range(3):
        assert r.pick("conversation-1", prompt=prompt) is pinned
    assert r.index.matched_tokens(pinned, block_chain(prompt, 4)) == len(prompt)  # and it caches there now


def test_least_outstanding_policy_ignores_prefixes() -> None:
    r = router(policy="least_outstanding")
    prompt = tenant(11)
    picks = [r.pick(None, prompt=prompt) for _ in range(4)]
    assert {u.base_url for u in picks} == {"http://up-0:8000", "http://up-1:8000"}
    assert r.index.size_tokens(picks[0]) == 0


def test_a_down_upstream_forgets_its_cache_and_is_not_picked() -> None:
    r = router()
    prompt = tenant(12)
    home = r.pick(None, prompt=prompt)
    home.mark_down("test")
    away = r.pick(None, prompt=prompt)
    assert away is not home
    home.mark_up()  # back, perhaps restarted: the prompt now lives on `away` only
    assert r.index.size_tokens(home) == 0
    assert r.pick(None, prompt=prompt) is away


def test_a_retry_excludes_the_upstream_that_failed() -> None:
    r = router()
    prompt = tenant(13)
    home = r.pick(None, prompt=prompt)
    assert r.pick(None, [home], prompt=prompt) is not home
    assert r.pick(None, r.upstreams, prompt=prompt) is None


def test_the_tree_forgets_least_recent_prompts_beyond_its_capacity_leaves_first() -> None:
    index = PrefixIndex(block_tokens=4, capacity_tokens=64)
    old, new = block_chain(tenant(14), 4), block_chain(tenant(15), 4)
    index.insert("u", old)
    assert index.matched_tokens("u", old) == 64
    index.insert("u", new[:8])  # 32 tokens more: the 32 deepest tokens of `old` go, its first half stays
    assert index.matched_tokens("u", old) == 32 and index.matched_tokens("u", new) == 32
    assert index.size_tokens("u") == 64


def test_blocks_name_whole_prefixes_not_their_own_tokens() -> None:
    a = block_chain([1, 2, 3, 4, 5, 6, 7, 8], 4)
    b = block_chain([9, 9, 9, 9, 5, 6, 7, 8], 4)
    assert a[1] != b[1]  # the same second block after a different first block is another prefix
    assert block_chain([1, 2, 3], 4) == []  # a partial block is never cached


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="capacity_tokens"):
        PrefixIndex(block_tokens=16, capacity_tokens=8)
