"""API keys: who may call what.

Three kinds of route: *public* ones (health, metrics; configurable) answer everyone; *admin* ones (the model
repository API's load, unload and reload) need the admin key; everything else needs an API key (or the admin key).
A fourth, the web console's page and its static files, holds no data: a browser cannot attach a key to a page
navigation, so it is served without one (the page then asks for the key and sends it on every call, and the console's
data routes under /ui/api are inference routes); it still passes the drain check and the per-caller rate limit.
When no API key is configured the inference routes are open, as in vLLM and Triton, but the admin routes stay
closed unless an admin key is configured: nobody can load models over the network by accident.

Routes are classified on a canonical form of the path, and non-canonical paths (`//`, `.` or `..` segments,
encoded slashes or dots) are refused outright, so no spelling of an admin path reaches it as something else.
Keys are compared by their SHA-256 digests with `hmac.compare_digest`, against every key, so timing says
nothing about a key's content or length; keys are never logged, only a short fingerprint of their digest.

Besides the keys of the configuration, named keys (`gateway/keys/`, managed through /admin/keys) are found by their
digest; they carry a policy (models, limits, budget, priority). Once any named key exists, inference needs a key.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import Enum
from typing import Protocol

from gateway.errors import AuthenticationError, InvalidRequestError, PermissionDeniedError
from gateway.keys.policy import KeyRecord


class Role(Enum):
    PUBLIC = "public"
    INFERENCE = "inference"
    ADMIN = "admin"
    CONSOLE = "console"  # the console's page and static files: key optional, rate limited like inference


@dataclass(frozen=True)
class Principal:
    """Who is calling: `key_id` is a fingerprint of the key (safe to log and to label rate limits by); `tenant`
    the key's whole SHA-256 digest (hex), which scopes what the key owns (KV sessions); empty for anonymous callers.
    For a named key, `key_id` and `tenant` are its id (they survive a rotation) and `key` its record."""

    key_id: str
    admin: bool = False
    tenant: str = field(default="", repr=False)
    key: KeyRecord | None = field(default=None, repr=False, compare=False)


ANONYMOUS = Principal("anonymous")

DEFAULT_PUBLIC_PATHS = ("/health", "/v2/health/live", "/v2/health/ready", "/metrics")
ADMIN_PREFIXES = ("/v2/repository", "/admin", "/v1/load_lora_adapter", "/v1/unload_lora_adapter")  # + vLLM's LoRA calls
CONSOLE_PAGES = ("/", "/ui", "/ui/")
CONSOLE_ASSETS = "/ui/assets/"
# Listing the repository is reading, as in Triton (which serves the index to every client by default): whoever may
# infer may list the models they can infer on. Loading, unloading and reloading stay admin-only.
INFERENCE_PATHS = ("/v2/repository/index",)
GRPC_PUBLIC_METHODS = ("ServerLive", "ServerReady")
GRPC_ADMIN_METHODS = ("RepositoryModelLoad", "RepositoryModelUnload")


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


def canonical_path(raw_path: bytes, path: str) -> str:
    """The path routing will see, or InvalidRequestError if it could be read in two ways."""
    raw = raw_path.decode("latin-1").lower() if raw_path else ""
    if any(enc in raw for enc in ("%2f", "%2e", "%5c")) or "\\" in path or "\x00" in path:
        raise InvalidRequestError("the request path must not contain encoded slashes, dots or backslashes")
    segments = path.split("/")[1:]
    if not path.startswith("/") or any(s in ("", ".", "..") for s in segments[:-1]) or segments[-1] in (".", ".."):
        raise InvalidRequestError("the request path must be canonical (no '//', '.' or '..' segments)")
    return path


class NamedKeys(Protocol):
    """The named keys (`gateway/keys/service.py`), as authentication needs them."""

    @property
    def has_keys(self) -> bool:
        """Whether any named key is live: then inference needs a key."""

    def authenticate(self, digest: str) -> KeyRecord | None:
        """The key with this hex SHA-256 digest, None if none; AuthenticationError for a revoked or expired one."""


class KeyStore:
    """The configured keys and the route policy; `authorize` is the one entry point for HTTP and gRPC."""

    def __init__(
        self,
        api_keys: Iterable[str] = (),
        admin_keys: Iterable[str] = (),
        public_paths: Iterable[str] = DEFAULT_PUBLIC_PATHS,
        console: bool = False,
        named: NamedKeys | None = None,
    ) -> None:
        self._api = [_digest(k) for k in api_keys if k]
        self._admin = [_digest(k) for k in admin_keys if k]
        self.public_paths = frozenset(public_paths)
        self.console = console  # serve the console's page and assets without a key
        self.named = named

    @property
    def admin_enabled(self) -> bool:
        return bool(self._admin)

    @property
    def inference_open(self) -> bool:
        return not self._api and not (self.named is not None and self.named.has_keys)

    def role_of(self, path: str) -> Role:
        if path in self.public_paths:
            return Role.PUBLIC
        if self.console and (path in CONSOLE_PAGES or path.startswith(CONSOLE_ASSETS)):
            return Role.CONSOLE
        if path in INFERENCE_PATHS:
            return Role.INFERENCE
        if any(path == p or path.startswith(p + "/") for p in ADMIN_PREFIXES):
            return Role.ADMIN
        return Role.INFERENCE

    @staticmethod
    def grpc_role(method: str) -> Role:
        name = method.rsplit("/", 1)[-1]
        if name in GRPC_PUBLIC_METHODS:
            return Role.PUBLIC
        return Role.ADMIN if name in GRPC_ADMIN_METHODS else Role.INFERENCE

    def _match(self, presented: bytes, keys: list[bytes]) -> bool:
        found = False
        for key in keys:  # no early exit: the time taken does not depend on which key matched
            found |= hmac.compare_digest(presented, key)
        return found

    def identify(self, authorization: str | None) -> Principal:
        """The caller named by an `Authorization: Bearer <key>` header; AuthenticationError (401) otherwise."""
        if authorization is None:
            raise AuthenticationError("You didn't provide an API key: send 'Authorization: Bearer <api key>'.")
        scheme, _, key = authorization.strip().partition(" ")
        key = key.strip()
        if scheme.lower() != "bearer" or not key:
            raise AuthenticationError("the Authorization header must be 'Bearer <api key>'")
        presented = _digest(key)
        fingerprint = presented.hex()[:12]
        if self._match(presented, self._admin):
            return Principal(fingerprint, admin=True, tenant=presented.hex())
        if self._match(presented, self._api):
            return Principal(fingerprint, tenant=presented.hex())
        named = self.named.authenticate(presented.hex()) if self.named is not None else None
        if named is not None:
            return Principal(named.id, tenant="key:" + named.id, key=named)
        raise AuthenticationError("Incorrect API key provided.")

    def authorize(self, role: Role, authorization: str | None) -> Principal:
        """The caller if it may use a route of `role`; AuthenticationError (401) or PermissionDeniedError (403)."""
        if role is Role.PUBLIC:
            return ANONYMOUS
        if role is Role.ADMIN:
            if not self._admin:
                raise PermissionDeniedError(
                    "the admin API (the model repository, /admin) is disabled; start the server with an admin key "
                    "(--admin-key-file or SWITCHYARD_ADMIN_KEY) to enable it"
                )
            principal = self.identify(authorization)
            if not principal.admin:
                raise PermissionDeniedError("this route needs the admin key")
            return principal
        if not self.inference_open and role is not Role.CONSOLE:
            return self.identify(authorization)
        try:  # open inference (or the console's page): any key (or none) is welcome; a known key names its caller
            return self.identify(authorization)
        except AuthenticationError:
            return ANONYMOUS
