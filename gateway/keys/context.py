"""The named key of the request being served, for the code that runs it: which models it sees, its priority, and
where its tokens are counted.

The access checks bind a `KeyAccount` for each request made with a named key; the frontends need not know about
keys: `ModelRegistry.get` asks `check_model` (404 for a model the key may not use, as if it did not exist), the
model lists ask `visible`, the code that builds engine requests asks `priority`, and `request_metrics` reports
tokens through `charge` (the one place that sees every LLM token). Outside a keyed request all of these do nothing.
"""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gateway.errors import ModelNotFoundError
from gateway.keys.policy import KeyRecord

if TYPE_CHECKING:
    from gateway.keys.service import KeyService


@dataclass
class KeyAccount:
    """One request's key, and the model it named (set by its first model lookup); usage is counted under both.
    `inference`: the request is one to count (a POST, a gRPC infer call), not a metadata or readiness lookup.
    The request is in flight for its key's limits until `finish` (work it left running, such as a background
    response, still charges its tokens)."""

    key: KeyRecord
    service: KeyService
    model: str | None = None
    inference: bool = True
    finished: bool = False
    charged: int = 0  # tokens charged while in flight

    def charge(self, prompt: int = 0, cached: int = 0, completion: int = 0) -> None:
        if self.model is None:
            return
        self.service.charge(self.key, self.model, prompt, cached, completion, in_flight=not self.finished)
        if not self.finished:
            self.charged += prompt + completion

    def finish(self, status: int) -> None:
        """The request answered `status` (once): it leaves the key's requests in flight, and counts in the key's
        usage if it named a model, as an error from 400 up."""
        if self.finished:
            return
        self.finished = True
        counted = self.model is not None and self.inference
        self.service.release(self.key, self.charged, sample=counted)
        if counted:
            assert self.model is not None
            self.service.ledger.add(self.key.id, self.model, requests=1, errors=int(status >= 400))


_account: ContextVar[KeyAccount | None] = ContextVar("switchyard_key_account", default=None)


def bind(account: KeyAccount) -> None:
    _account.set(account)


def current() -> KeyAccount | None:
    return _account.get()


def check_model(name: str) -> None:
    """Refuse a model the current key may not use as if it did not exist (404 `model_not_found`); the first model
    a request names is the one its usage is counted under."""
    account = _account.get()
    if account is None:
        return
    if not account.key.policy.allows(name):
        raise ModelNotFoundError(name)
    if account.model is None:
        account.model = name


def visible(name: str) -> bool:
    """Whether model lists (/v1/models and the like) show `name` to the current caller."""
    account = _account.get()
    return account is None or account.key.policy.allows(name)


def priority(requested: int) -> int:
    """The scheduler priority of a request that asked for `requested` (lower runs first): the key's priority plus
    the request's, where a request may lower its urgency but not raise it above its key's (negative values count
    as 0). Without a named key, the request's own."""
    account = _account.get()
    if account is None:
        return requested
    return account.key.policy.priority + max(requested, 0)


def charge(prompt: int = 0, cached: int = 0, completion: int = 0) -> None:
    """Tokens of the current request: they count against its key's tokens per minute, budget and usage."""
    account = _account.get()
    if account is not None:
        account.charge(prompt, cached, completion)
