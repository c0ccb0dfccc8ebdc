"""The console's routes in-process (no models loaded): the page and its files, who may read what, the limits
that apply, --no-console, and that the page loads nothing from anywhere but the server."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from gateway.app import create_app
from gateway.cli import load_config
from gateway.config import build_config
from gateway.console import overview
from gateway.console.routes import STATIC
from gateway.keys.auth import KeyStore, Role
from tests.conftest import DEFAULT_MODEL, ROOT

KEY = "sk-console-test"
AUTH = {"authorization": f"Bearer {KEY}"}


def client(**settings: Any) -> TestClient:
    """The app without its lifespan: routes answer, no model is loaded (every folder shows as unloaded)."""
    config = build_config(model_repository=ROOT / "model_repository", **settings)
    return TestClient(create_app(config))


def assets_of(html: str) -> list[str]:
    return re.findall(r'(?:href|src)="(/ui/assets/[^"]+)"', html)


def test_page_and_files_are_served_without_a_key_with_a_strict_policy() -> None:
    c = client(api_keys=[KEY])
    for path in ("/", "/ui/"):
        r = c.get(path)
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
        assert "default-src 'self'" in r.headers["content-security-policy"]
        assert r.headers["x-content-type-options"] == "nosniff"
    r = c.get("/ui", follow_redirects=False)
    assert r.status_code == 308 and r.headers["location"] == "/ui/"
    html = c.get("/").text
    assets = assets_of(html)
    assert "/ui/assets/console.css" in assets and "/ui/assets/js/main.js" in assets
    for path in assets + [f"/ui/assets/js/{p.name}" for p in (STATIC / "js").glob("*.js")]:
        r = c.get(path)
        assert r.status_code == 200, path
        assert r.headers["content-type"].split(";")[0] in ("text/css", "text/javascript", "application/javascript")
        assert "content-security-policy" in r.headers
    assert c.get("/ui/assets/missing.js").status_code == 404


def test_console_data_needs_the_api_key() -> None:
    c = client(api_keys=[KEY])
    for path in ("/ui/api/overview", "/ui/api/stats"):
        assert c.get(path).status_code == 401
        assert c.get(path, headers={"authorization": "Bearer wrong"}).status_code == 401
        assert c.get(path, headers=AUTH).status_code == 200
    assert c.get("/ui/api/stats", headers=AUTH).json()["llms"] == []  # nothing is loaded here


def test_overview_describes_every_folder_even_unloaded() -> None:
    body = client(admin_keys=["sk-admin"]).get("/ui/api/overview").json()
    server = body["server"]
    assert server["version"] and server["admin_enabled"] and not server["auth_required"]
    cpu = server["cpu"]
    assert cpu["visible"] >= 1 and 0 < cpu["budget"] <= cpu["visible"] and cpu["threads"] >= 1 and cpu["reason"]
    assert server["features"] == {"rerank": True}  # gateway/rerank serves POST /v1/rerank
    models = {m["name"]: m for m in body["models"]}
    llm = models[DEFAULT_MODEL]
    assert (llm["state"], llm["kind"], llm["backend"], llm["dtype"], llm["max_model_len"]) == (
        "unloaded",
        "llm",
        "pytorch",
        "float32",
        8192,
    )
    assert models["circle_classifier"]["backend"] == "onnxruntime"
    assert models["circle_pipeline"]["backend"] == "ensemble"


def test_the_rerank_tab_follows_the_route() -> None:
    """The page shows its Rerank tab only when the server has POST /v1/rerank."""
    config = build_config(model_repository=ROOT / "model_repository")
    app = create_app(config)
    assert TestClient(app).get("/ui/api/overview").json()["server"]["features"]["rerank"] is True
    app.router.routes[:] = [r for r in app.router.routes if getattr(r, "path", None) != "/v1/rerank"]
    assert TestClient(app).get("/ui/api/overview").json()["server"]["features"]["rerank"] is False


def test_broken_config_is_shown_with_its_reason(tmp_path: Path) -> None:
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.yaml").write_text("backend: pytorch\nno_such_field: 1\n")
    config = build_config(model_repository=tmp_path, model_control_mode="explicit")
    body = TestClient(create_app(config)).get("/ui/api/overview").json()
    [model] = body["models"]
    assert model["name"] == "broken" and model["state"] == "unloaded"
    assert "no_such_field" in model["config_error"] and str(tmp_path) not in model["config_error"]


@pytest.mark.parametrize(
    ("row", "state"),
    [
        ({"name": "m"}, ("unloaded", "")),
        ({"name": "m", "state": "READY", "reason": ""}, ("ready", "")),
        ({"name": "m", "state": "LOADING", "reason": ""}, ("loading", "")),
        ({"name": "m", "state": "UNLOADING", "reason": ""}, ("unloading", "")),
        ({"name": "m", "state": "UNAVAILABLE", "reason": "unloaded"}, ("unloaded", "")),
        ({"name": "m", "state": "UNAVAILABLE", "reason": "bad weights"}, ("failed", "bad weights")),
    ],
)
def test_index_states_become_console_states(row: dict[str, str], state: tuple[str, str]) -> None:
    assert overview._state(row) == state


def test_the_page_and_its_data_share_the_rate_limit() -> None:
    c = client(api_keys=[KEY], rate_limit_rpm=2)
    assert c.get("/").status_code == 200
    assert c.get("/ui/assets/console.css").status_code == 200
    r = c.get("/ui/")
    assert r.status_code == 429 and "retry-after" in r.headers  # per address, as keyless inference
    assert c.get("/ui/api/stats", headers=AUTH).status_code == 200
    assert c.get("/ui/api/stats", headers=AUTH).status_code == 200
    assert c.get("/ui/api/overview", headers=AUTH).status_code == 429  # per key, as /v1


def test_the_body_limit_applies() -> None:
    c = client(api_keys=[KEY], max_body_bytes=1024)
    assert c.request("GET", "/ui/api/stats", headers=AUTH, content=b"x" * 4096).status_code == 413
    assert c.request("GET", "/", content=b"x" * 4096).status_code == 413


def test_paths_out_of_the_asset_folder_are_refused() -> None:
    c = client()
    assert c.get("/ui/assets/%2e%2e/routes.py").status_code == 400
    assert c.get("/ui/assets/js/%2e%2e/%2e%2e/routes.py").status_code == 400
    r = c.get("/ui/assets/../routes.py")  # the client normalises this to /ui/routes.py
    assert r.status_code == 404


def test_no_console() -> None:
    c = client(console=False)
    assert c.get("/").status_code == 404
    assert c.get("/ui/").status_code == 404
    assert c.get("/ui/api/overview").status_code == 404
    assert load_config(["--no-console"], environ={}).console is False
    assert load_config([], environ={}).console is True
    assert load_config([], environ={"SWITCHYARD_CONSOLE": "0"}).console is False


def test_console_role_needs_the_console() -> None:
    assert KeyStore(api_keys=[KEY], console=True).role_of("/") is Role.CONSOLE
    assert KeyStore(api_keys=[KEY], console=True).role_of("/ui/assets/js/main.js") is Role.CONSOLE
    assert KeyStore(api_keys=[KEY], console=True).role_of("/ui/api/stats") is Role.INFERENCE
    assert KeyStore(api_keys=[KEY], console=False).role_of("/") is Role.INFERENCE


def test_the_page_loads_nothing_from_elsewhere() -> None:
    """No CDN, no remote font, no remote import: every URL in the page's files is this server's."""
    files = [p for p in STATIC.rglob("*") if p.is_file()]
    assert {p.suffix for p in files} <= {".html", ".css", ".js"}
    for path in files:
        text = path.read_text()
        assert not re.search(r"https?://|//cdn|@import|url\(", text), path
        for target in re.findall(r'from "(\.[^"]+)"', text):  # ES module imports resolve to files that exist
            assert (path.parent / target).resolve().is_file(), (path, target)
