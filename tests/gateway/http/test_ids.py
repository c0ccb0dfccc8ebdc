"""Random ids: the shape of uuid4().hex, and no repeats."""

from __future__ import annotations

import re

from gateway.http.ids import random_hex


def test_random_hex_is_32_hex_digits_and_does_not_repeat() -> None:
    ids = [random_hex() for _ in range(10000)]
    assert all(re.fullmatch(r"[0-9a-f]{32}", i) for i in ids)
    assert len(set(ids)) == len(ids)
