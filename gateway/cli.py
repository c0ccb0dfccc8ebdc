"""`switchyard serve ...`: flags and `SWITCHYARD_*` environment variables -> `ServerConfig` -> uvicorn.

The flags and variables are not declared here: they come from `ServerConfig`'s fields (gateway/config.py).
"""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any

from gateway import __version__
from gateway.config import SETTINGS, ServerConfig, Setting, build_config
from gateway.errors import ConfigError
from gateway.server.allocator import cap_arenas

ENV_NOTE = (
    "Every flag can also be set by its environment variable (shown with it); a flag given on the command "
    "line wins. Lists are comma-separated in the environment; booleans read 1/true/yes/on or 0/false/no/off."
)


def _help(spec: Setting) -> str:
    env = spec.env + (", comma-separated" if spec.kind == "list" else "")
    env += "".join(f", or {alias}" for alias in spec.env_aliases)
    text = spec.help + (" (repeatable)" if spec.kind == "list" and spec.flag else "")
    text += f" [env {env}; default: {spec.shown_default}]"
    if spec.doc:
        text += f" (docs/{spec.doc.split('#')[0]})"
    return text.replace("`", "").replace("%", "%%")


def _argument(spec: Setting) -> dict[str, Any]:
    """argparse's keywords for one setting; values stay strings, ServerConfig checks them (one place for errors)."""
    if spec.kind == "bool":
        return {"action": argparse.BooleanOptionalAction}
    keywords: dict[str, Any] = {"metavar": spec.metavar}
    if spec.choices:
        keywords = {"type": str.lower, "choices": spec.choices}
    if spec.kind == "list":
        keywords["action"] = "append"
    return keywords


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="switchyard", description="OpenAI-compatible LLM serving gateway.")
    parser.add_argument("--version", action="version", version=f"switchyard {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    env_only = [spec for spec in SETTINGS.values() if spec.flag is None]
    serve = sub.add_parser(
        "serve",
        help="serve a model repository over HTTP",
        description=ENV_NOTE,
        epilog="environment only: " + "; ".join(f"{s.name}: {_help(s)}" for s in env_only),
    )
    groups: dict[str, Any] = {}
    for spec in SETTINGS.values():
        if spec.flag is None:
            continue  # environment only
        if spec.group and spec.group not in groups:
            groups[spec.group] = serve.add_argument_group(spec.group)
        where = groups.get(spec.group, serve)
        # SUPPRESS: a flag not given leaves no attribute, so the environment and then the field's default apply.
        where.add_argument(
            spec.flag,
            *spec.flag_aliases,
            dest=spec.name,
            default=argparse.SUPPRESS,
            help=_help(spec),
            **_argument(spec),
        )
    return parser


def _from_env(spec: Setting, raw: str) -> Any:
    return [item.strip() for item in raw.split(",") if item.strip()] if spec.kind == "list" else raw


def read_settings(args: argparse.Namespace, environ: Mapping[str, str]) -> tuple[dict[str, str], dict[str, Any]]:
    """(where each value came from, the values given) from the flags and the environment; the flag wins unless the
    setting combines both (API keys). An empty variable counts as unset."""
    sources: dict[str, str] = {}
    values: dict[str, Any] = {}
    for spec in SETTINGS.values():
        env = next((name for name in spec.envs if environ.get(name, "").strip()), None)
        from_env = _from_env(spec, environ[env]) if env else None
        if spec.name in args:
            values[spec.name], sources[spec.name] = getattr(args, spec.name), str(spec.flag)
            if spec.combine and from_env:
                values[spec.name] = [*values[spec.name], *from_env]
                sources[spec.name] = f"{spec.flag} and {env}"
        elif env:
            values[spec.name], sources[spec.name] = from_env, env
    return sources, values


def load_config(argv: Sequence[str], environ: Mapping[str, str] | None = None) -> ServerConfig:
    """The config of `switchyard serve *argv` in an environment (the process's by default)."""
    args = build_parser().parse_args(["serve", *argv])
    sources, values = read_settings(args, os.environ if environ is None else environ)
    return build_config(sources, **values)


def serve(config: ServerConfig) -> None:
    """Load the repository (config errors fail here, before the port opens), then serve until SIGTERM."""
    import uvicorn

    from gateway.app import build_model_control, create_app
    from gateway.server.http_limits import BoundedHeadHttpToolsProtocol  # huge request heads: 431
    from gateway.server.lifecycle import DrainingServer

    control = build_model_control(config)
    control.prepare()
    app = create_app(config, control)
    server_config = uvicorn.Config(
        app,
        host=config.host,
        port=config.http_port,
        log_level=config.log_level,
        timeout_graceful_shutdown=5,
        log_config=None,
        access_log=False,
        http=BoundedHeadHttpToolsProtocol,
    )
    server = DrainingServer(server_config, app.state.lifecycle, config.drain_seconds)
    server.run()
    if not server.started:  # startup failed (a model with --exit-on-error, a port in use): uvicorn logged why
        raise ConfigError("the server did not start; the error is logged above")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from gateway.server.request_log import setup_logging

    try:
        sources, values = read_settings(args, os.environ)
        config = build_config(sources, **values)
    except ConfigError as exc:
        setup_logging("info", "text")
        logging.getLogger("switchyard").error("configuration error: %s", exc)
        return 2
    setup_logging(config.log_level, config.log_format)
    cap_arenas(config.malloc_arenas, given="malloc_arenas" in config.model_fields_set)  # before any thread starts
    try:
        serve(config)
    except ConfigError as exc:
        logging.getLogger("switchyard").error("configuration error: %s", exc)
        return 2
    return 0
