"""KeyStore: route classes, key checks, canonical paths."""

from __future__ import annotations

import pytest

from gateway.errors import AuthenticationError, InvalidRequestError, PermissionDeniedError
from gateway.keys.auth import ANONYMOUS, KeyStore, Role, canonical_path

KEYS = KeyStore(api_keys=["sk-user-1", "sk-user-2"], admin_keys=["sk-admin"])


def test_routes_are_classified() -> None:
    assert KEYS.role_of("/health") is Role.PUBLIC
    assert KEYS.role_of("/metrics") is Role.PUBLIC
    assert KEYS.role_of("/v2/health/ready") is Role.PUBLIC
    assert KEYS.role_of("/v2/repository/index") is Role.INFERENCE  # listing is reading, as in Triton
    assert KEYS.role_of("/v2/repository/index/x") is Role.ADMIN
    assert KEYS.role_of("/v2/repository/models/x/load") is Role.ADMIN
    assert KEYS.role_of("/v2/repositoryx") is Role.INFERENCE  # a prefix of a segment is not the admin tree
    assert KEYS.role_of("/v1/chat/completions") is Role.INFERENCE
    assert KEYS.role_of("/health/") is Role.INFERENCE  # public paths are exact: anything else is denied by default
    assert KEYS.role_of("/nonexistent") is Role.INFERENCE
    assert KEYS.role_of("/v1/load_lora_adapter") is Role.ADMIN  # vLLM's LoRA calls (docs/lora.md)
    assert KEYS.role_of("/v1/unload_lora_adapter") is Role.ADMIN


def test_grpc_methods_are_classified() -> None:
    service = "/inference.GRPCInferenceService/"
    assert KeyStore.grpc_role(service + "ServerLive") is Role.PUBLIC
    assert KeyStore.grpc_role(service + "ModelInfer") is Role.INFERENCE
    assert KeyStore.grpc_role(service + "RepositoryModelLoad") is Role.ADMIN
    assert KeyStore.grpc_role(service + "RepositoryModelUnload") is Role.ADMIN
    assert KeyStore.grpc_role(service + "RepositoryIndex") is Role.INFERENCE


def test_inference_keys() -> None:
    assert (
        KEYS.authorize(Role.INFERENCE, "Bearer sk-user-1").key_id
        != KEYS.authorize(Role.INFERENCE, "Bearer sk-user-2").key_id
    )
    assert (
        KEYS.authorize(Role.INFERENCE, "bearer   sk-user-2 ").admin is False
    )  # the scheme is case-insensitive (RFC 7235)
    assert KEYS.authorize(Role.INFERENCE, "Bearer sk-admin").admin  # the admin key works everywhere
    assert KEYS.authorize(Role.PUBLIC, None) is ANONYMOUS


@pytest.mark.parametrize(
    "header",
    [
        None,
        "",
        "sk-user-1",
        "Basic sk-user-1",
        "Bearer",
        "Bearer sk-user-3",
        "Bearer SK-USER-1",
        "Bearer sk-user-",
        "Bearer sk-user-1x",
    ],
)
def test_bad_inference_credentials_get_401(header: str | None) -> None:
    with pytest.raises(AuthenticationError) as err:
        KEYS.authorize(Role.INFERENCE, header)
    assert err.value.status == 401
    assert "sk-user" not in err.value.message.lower()  # the expected key never appears in an error


def test_admin_routes() -> None:
    assert KEYS.authorize(Role.ADMIN, "Bearer sk-admin").admin
    with pytest.raises(PermissionDeniedError):
        KEYS.authorize(Role.ADMIN, "Bearer sk-user-1")  # a valid key, but not the admin's
    with pytest.raises(AuthenticationError):
        KEYS.authorize(Role.ADMIN, None)
    with pytest.raises(AuthenticationError):
        KEYS.authorize(Role.ADMIN, "Bearer sk-admim")


def test_without_keys_inference_is_open_and_admin_is_closed() -> None:
    open_store = KeyStore()
    assert open_store.authorize(Role.INFERENCE, None) is ANONYMOUS
    assert open_store.authorize(Role.INFERENCE, "Bearer unused") is ANONYMOUS  # SDKs insist on sending some key
    with pytest.raises(PermissionDeniedError) as err:
        open_store.authorize(Role.ADMIN, "Bearer anything")
    assert "admin key" in err.value.message


@pytest.mark.parametrize(
    ("raw", "path"),
    [
        (b"//v2/repository/index", "//v2/repository/index"),
        (b"/v1/./models", "/v1/./models"),
        (b"/v1/models/../../v2/repository/index", "/v1/models/../../v2/repository/index"),
        (
            b"/v2/%72epository/models/x/load",
            "/v2/repository/models/x/load",
        ),  # fine: decodes to the canonical admin path
        (b"/v2/repository%2findex", "/v2/repository/index"),
        (b"/v1/models/%2e%2e/x", "/v1/models/../x"),
        (b"/v1/models\\..", "/v1/models\\.."),
        (b"/health/..", "/health/.."),
    ],
)
def test_non_canonical_paths(raw: bytes, path: str) -> None:
    if raw == b"/v2/%72epository/models/x/load":
        assert KEYS.role_of(canonical_path(raw, path)) is Role.ADMIN
        return
    with pytest.raises(InvalidRequestError):
        canonical_path(raw, path)
