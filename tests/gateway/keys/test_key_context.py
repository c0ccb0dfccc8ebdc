"""The current request's key as the frontends see it: model checks, hidden models, priority, token charges, and
how a request is counted when it ends."""

from __future__ import annotations

import contextvars

import pytest

from gateway.errors import ModelNotFoundError
from gateway.keys import context as key_context
from gateway.keys.context import KeyAccount
from gateway.keys.limits import KeyLimiter
from gateway.keys.policy import KeyPolicy, KeyRecord
from gateway.keys.service import KeyService
from gateway.repository.registry import ModelRegistry


def in_request(policy: KeyPolicy, body) -> KeyService:  # noqa: ANN001 - a callable of the account
    """Run `body(account)` in a context of its own, as a request made with a key of `policy`."""
    service = KeyService(lambda: None, KeyLimiter(), wall=lambda: 1_800_000_000.0)  # type: ignore[arg-type,return-value]
    key = KeyRecord("key_t", "t", "d", "p", policy)

    def run() -> None:
        account = KeyAccount(key, service)
        key_context.bind(account)
        body(account)

    contextvars.copy_context().run(run)
    return service


def test_outside_a_keyed_request_nothing_changes() -> None:
    key_context.check_model("anything")
    assert key_context.visible("anything") and key_context.priority(-3) == -3
    key_context.charge(prompt=5)  # no key: nowhere to count, no error


def test_a_model_outside_the_policy_does_not_exist() -> None:
    def body(account: KeyAccount) -> None:
        with pytest.raises(ModelNotFoundError) as missing:
            ModelRegistry().get("other")
        assert missing.value.status == 404 and missing.value.code == "model_not_found"
        assert not key_context.visible("other") and key_context.visible("llm-a")
        with pytest.raises(ModelNotFoundError):
            ModelRegistry().get("llm-a")  # allowed, but not loaded: the same answer
        assert account.model == "llm-a"

    in_request(KeyPolicy(models=("llm-*",)), body)


def test_priority_is_the_keys_plus_the_requests_never_more_urgent_than_the_key() -> None:
    seen: list[int] = []
    in_request(KeyPolicy(priority=5), lambda _: seen.extend(key_context.priority(p) for p in (0, 2, -10)))
    assert seen == [5, 7, 5]


def test_tokens_and_the_end_of_a_request_are_counted_under_its_model() -> None:
    def body(account: KeyAccount) -> None:
        key_context.charge(prompt=3)  # before a model was named: nothing to count it under
        key_context.check_model("m")
        key_context.charge(prompt=10)
        key_context.charge(completion=4)
        key_context.charge(cached=8)
        account.finish(500)
        account.finish(500)  # counted once

    service = in_request(KeyPolicy(), body)
    totals = service.ledger.totals[("key_t", "m")]
    assert (totals.requests, totals.errors, totals.prompt_tokens, totals.completion_tokens, totals.cached_tokens) == (
        1,
        1,
        10,
        4,
        8,
    )


def test_metadata_reads_are_not_counted_as_requests() -> None:
    def body(account: KeyAccount) -> None:
        account.inference = False  # a GET of the model's metadata
        key_context.check_model("m")
        account.finish(200)

    assert in_request(KeyPolicy(), body).ledger.totals == {}
