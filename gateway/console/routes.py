"""HTTP routes of the web console: the page, its static files, and its JSON (overview, live stats).

The page and its files are plain HTML, CSS and JavaScript modules in `static/` (no build step). They hold no
data and are served without a key (see `auth.Role.CONSOLE`); everything the page shows comes from the API or
from /ui/api/*, which are inference routes: the key the user enters in the page, the rate limits and the body
limit apply to them as to /v1. A strict Content-Security-Policy keeps the page to this origin.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import FileResponse, RedirectResponse, Response
from starlette.staticfiles import StaticFiles

from gateway.console import live_stats, overview
from gateway.keys import context as key_context
from gateway.keys.auth import KeyStore

STATIC = Path(__file__).resolve().parent / "static"

SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
        "object-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",  # revalidate (ETag): an upgraded server never runs an old page
}

router = APIRouter(include_in_schema=False)


class _Assets(StaticFiles):
    """The page's files, with the page's security headers."""

    def file_response(self, *args: Any, **kwargs: Any) -> Response:
        response = super().file_response(*args, **kwargs)
        response.headers.update(SECURITY_HEADERS)
        return response


@router.get("/")
@router.get("/ui/")
async def page() -> Response:
    return FileResponse(STATIC / "index.html", media_type="text/html; charset=utf-8", headers=SECURITY_HEADERS)


@router.get("/ui")
async def page_slash() -> Response:
    return RedirectResponse("/ui/", status_code=308)


@router.get("/ui/api/overview")
async def overview_json(request: Request) -> dict[str, Any]:
    """Server facts and every model folder with its state (what the Overview tab shows)."""
    app = request.app
    keys: KeyStore = app.state.keys
    routes = frozenset(getattr(r, "path", "") for r in app.routes)
    return {
        "server": overview.server(
            app.state.config, keys.admin_enabled, not keys.inference_open, bool(app.state.ready), routes
        ),
        "models": [m for m in overview.models(app.state.model_control) if key_context.visible(m["name"])],
    }


@router.get("/ui/api/stats")
async def stats_json(request: Request) -> dict[str, Any]:
    """Counters, gauges and histogram buckets as /metrics has them now (the charts difference two of these)."""
    return live_stats.snapshot(request.app.state.registry)


def add_console(app: FastAPI) -> None:
    app.include_router(router)
    app.mount("/ui/assets", _Assets(directory=STATIC), name="console-assets")
