"""A request's use of models: its deadline from the client's timeout headers, and the holds released once."""

from __future__ import annotations

from gateway.repository.model_use import close_use, current_use, header_deadline, open_use


def test_deadline_from_the_sdks_timeout_headers() -> None:
    assert header_deadline([(b"x-stainless-timeout", b"600")], now=10.0) == 610.0
    assert header_deadline([(b"x-stainless-read-timeout", b"2.5"), (b"x-stainless-timeout", b"600")], now=0.0) == 2.5
    assert header_deadline([(b"x-request-timeout", b"5"), (b"x-stainless-read-timeout", b"9")], now=0.0) == 5.0
    for bad in (b"0", b"-3", b"soon", b"inf", b"nan"):
        assert header_deadline([(b"x-request-timeout", bad)], now=0.0) is None
    assert header_deadline([], now=0.0) is None


def test_holds_are_released_once_when_the_use_closes() -> None:
    released: list[str] = []
    token = open_use(deadline=5.0)
    use = current_use()
    assert use is not None and use.deadline == 5.0
    use.hold(lambda: released.append("a"))
    use.hold(lambda: released.append("b"))
    close_use(token)
    assert released == ["a", "b"] and current_use() is None
    use.release()
    assert released == ["a", "b"]


def test_a_hold_taken_after_the_request_ended_is_released_at_once() -> None:
    released: list[str] = []
    token = open_use()
    use = current_use()
    close_use(token)
    assert use is not None
    use.hold(lambda: released.append("late"))
    assert released == ["late"]
