"""`switchyard serve ...`: flags and `SWITCHYARD_*` environment variables -> `ServerConfig` -> uvicorn."""

from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path

from gateway import __version__
from gateway.errors import ConfigError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="switchyard", description="OpenAI-compatible LLM serving gateway.")
    parser.add_argument("--version", action="version", version=f"switchyard {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve a model repository over HTTP")
    env = os.environ.get
    serve.add_argument("--model-repository", type=Path, default=env("SWITCHYARD_MODEL_REPOSITORY", "model_repository"),
                       help="folder of models, one sub-folder with a config.yaml each (default: %(default)s)")
    serve.add_argument("--host", default=env("SWITCHYARD_HOST", "127.0.0.1"),
                       help="interface to listen on; 0.0.0.0 in containers (default: %(default)s)")
    serve.add_argument("--http-port", type=int, default=int(env("SWITCHYARD_HTTP_PORT", "8000")),
                       help="port for /v1, /v2, /health and /metrics (default: %(default)s)")
    serve.add_argument("--grpc-port", type=int, default=int(env("SWITCHYARD_GRPC_PORT", "8001")),
                       help="port for the KServe v2 gRPC service; 0 disables it (default: %(default)s)")
    serve.add_argument("--metrics-port", type=int, default=int(env("SWITCHYARD_METRICS_PORT", "8002")),
                       help="extra port serving only /metrics; 0 disables it (default: %(default)s)")
    serve.add_argument("--log-level", default=env("SWITCHYARD_LOG_LEVEL", "info"),
                       choices=["debug", "info", "warning", "error"], help="(default: %(default)s)")
    serve.add_argument("--cache-dir", type=Path, default=env("SWITCHYARD_CACHE_DIR"),
                       help="where converted weights are cached (default: ~/.cache/switchyard)")
    serve.add_argument("--max-body-bytes", type=int, default=int(env("SWITCHYARD_MAX_BODY_BYTES", str(32 * 2**20))),
                       help="larger request bodies are refused with 413 (default: %(default)s)")
    serve.add_argument("--always-include-usage", action="store_true",
                       default=env("SWITCHYARD_ALWAYS_INCLUDE_USAGE", "") in ("1", "true", "yes"),
                       help="send a usage chunk on every stream (LangChain does not ask for one)")
    security = serve.add_argument_group("access control (see README: Security)")
    security.add_argument("--api-key", action="append", default=[], metavar="KEY",
                          help="an API key for /v1 and /v2 inference (repeatable; also SWITCHYARD_API_KEYS, "
                               "comma-separated). Without any key, inference is open.")
    security.add_argument("--api-key-file", type=Path, default=env("SWITCHYARD_API_KEY_FILE"),
                          help="file with one API key per line ('#' starts a comment)")
    security.add_argument("--admin-key-file", type=Path, default=env("SWITCHYARD_ADMIN_KEY_FILE"),
                          help="file with the admin key(s) for the repository API (also SWITCHYARD_ADMIN_KEY). "
                               "Without one, the repository API is disabled.")
    security.add_argument("--public-path", action="append", default=None, metavar="PATH",
                          help="an exact path served without a key (repeatable; default: the health routes "
                               "and /metrics)")
    security.add_argument("--cors-allow-origin", action="append", default=None, metavar="ORIGIN",
                          help="allow browsers from ORIGIN ('*' for any; repeatable; default: CORS off)")
    security.add_argument("--rate-limit-rpm", type=int, default=int(env("SWITCHYARD_RATE_LIMIT_RPM", "0")),
                          help="requests per minute per API key, or per address without one; 0 = off "
                               "(default: %(default)s)")
    security.add_argument("--rate-limit-tpm", type=int, default=int(env("SWITCHYARD_RATE_LIMIT_TPM", "0")),
                          help="prompt + generated tokens per minute per API key; 0 = off (default: %(default)s)")
    serve.add_argument("--drain-seconds", type=float, default=float(env("SWITCHYARD_DRAIN_SECONDS", "30")),
                       help="after SIGTERM, how long in-flight requests may take to finish (default: %(default)s)")
    serve.add_argument("--stream-send-timeout-secs", type=float,
                       default=float(env("SWITCHYARD_STREAM_SEND_TIMEOUT_S", "30")),
                       help="seconds one send of a stream may wait for a client that stopped reading before the "
                            "stream is closed and its generation aborted (env SWITCHYARD_STREAM_SEND_TIMEOUT_S)")
    serve.add_argument("--no-console", dest="console", action="store_false",
                       default=env("SWITCHYARD_CONSOLE", "1").lower() not in ("0", "false", "no"),
                       help="do not serve the web console at / and /ui/ (also SWITCHYARD_CONSOLE=0)")
    serve.add_argument("--log-format", default=env("SWITCHYARD_LOG_FORMAT", "text"), choices=["text", "json"],
                       help="json: one JSON object per line, with the request id (default: %(default)s)")
    serve.add_argument("--otlp-traces-endpoint", default=env("SWITCHYARD_OTLP_TRACES_ENDPOINT"), metavar="URL",
                       help="send a span per LLM request (queue, prefill, decode) over OTLP/HTTP to URL, e.g. "
                            "http://collector:4318/v1/traces; needs switchyard[tracing] (default: off)")
    control = serve.add_argument_group("model control (Triton's modes; see README: Model control)")
    control.add_argument("--model-control-mode", type=str.lower, choices=["none", "explicit", "poll"],
                         default=env("SWITCHYARD_MODEL_CONTROL_MODE", "none").lower(),
                         help="none: load every model at startup, repository load/unload refused; explicit: load "
                              "only --load-model models, load/unload through the repository API; poll: load every "
                              "model and apply repository changes as they appear (default: %(default)s)")
    control.add_argument("--load-model", action="append", default=None, metavar="NAME",
                         help="explicit mode: a model to load at startup (repeatable; '*' = all; also "
                              "SWITCHYARD_LOAD_MODEL, comma-separated)")
    control.add_argument("--repository-poll-secs", type=float, default=env("SWITCHYARD_REPOSITORY_POLL_SECS"),
                         help="poll mode: seconds between two scans of the repository (default: 15)")
    return parser


def _read_keys(path: Path | None, what: str) -> list[str]:
    """Keys from a file, one per line; a clear ConfigError if it cannot be read."""
    if path is None:
        return []
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise ConfigError(f"cannot read the {what} file {path}: {exc.strerror}; check the path and permissions.")
    keys = [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]
    if not keys:
        raise ConfigError(f"the {what} file {path} holds no key; write one key per line.")
    return keys


def _env_list(name: str) -> list[str]:
    """A comma-separated environment variable as a list (empty items dropped)."""
    return [v.strip() for v in os.environ.get(name, "").split(",") if v.strip()]


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from gateway.request_log import setup_logging

    setup_logging(args.log_level, args.log_format)
    import uvicorn

    from gateway.app import create_app
    from gateway.config import build_config
    from gateway.http_limits import BoundedHeadHttpToolsProtocol  # huge request heads: 431
    from gateway.lifecycle import DrainingServer
    from gateway.repository.registry import ModelRegistry

    try:
        config = build_config(
            model_repository=args.model_repository,
            host=args.host,
            http_port=args.http_port,
            grpc_port=args.grpc_port,
            metrics_port=args.metrics_port,
            log_level=args.log_level,
            cache_dir=args.cache_dir,
            max_body_bytes=args.max_body_bytes,
            always_include_usage=args.always_include_usage,
            api_keys=[*args.api_key, *_env_list("SWITCHYARD_API_KEYS"), *_read_keys(args.api_key_file, "API key")],
            admin_keys=[*_env_list("SWITCHYARD_ADMIN_KEY"), *_read_keys(args.admin_key_file, "admin key")],
            public_paths=args.public_path,
            cors_allow_origins=args.cors_allow_origin,
            rate_limit_rpm=args.rate_limit_rpm,
            rate_limit_tpm=args.rate_limit_tpm,
            drain_seconds=args.drain_seconds,
            stream_send_timeout_secs=args.stream_send_timeout_secs,
            log_format=args.log_format,
            console=args.console,
            model_control_mode=args.model_control_mode,
            load_models=args.load_model if args.load_model is not None else _env_list("SWITCHYARD_LOAD_MODEL"),
            repository_poll_secs=args.repository_poll_secs,
            otlp_traces_endpoint=args.otlp_traces_endpoint,
        )
        registry = ModelRegistry(config.model_repository, config.cache_dir, control_mode=config.model_control_mode,
                                 load_models=config.load_models, drain_timeout_s=config.drain_seconds)
        registry.prepare()  # fail fast on config errors, before the server starts
        app = create_app(config, registry)
        server_config = uvicorn.Config(app, host=config.host, port=config.http_port, log_level=config.log_level,
                                       timeout_graceful_shutdown=5, log_config=None, access_log=False,
                                       http=BoundedHeadHttpToolsProtocol)
        DrainingServer(server_config, app.state.lifecycle, config.drain_seconds).run()
    except ConfigError as exc:
        logging.getLogger("switchyard").error("configuration error: %s", exc)
        return 2
    return 0
