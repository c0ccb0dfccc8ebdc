"""`switchyard serve ...`: flags and `SWITCHYARD_*` environment variables -> `ServerConfig` -> uvicorn."""

from __future__ import annotations

import argparse
import logging
import os
import sys
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
    return parser


def _setup_logging(level: str) -> None:
    logging.basicConfig(
        level=level.upper(), format="%(asctime)s %(levelname)-7s %(name)s: %(message)s", stream=sys.stderr
    )


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _setup_logging(args.log_level)
    import uvicorn

    from gateway.app import create_app
    from gateway.config import build_config
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
        )
        registry = ModelRegistry(config.model_repository, config.cache_dir)
        registry.prepare()  # fail fast on config errors, before the server starts
        app = create_app(config, registry)
        uvicorn.run(app, host=config.host, port=config.http_port, log_level=config.log_level,
                    timeout_graceful_shutdown=30, log_config=None)
    except ConfigError as exc:
        logging.getLogger("switchyard").error("configuration error: %s", exc)
        return 2
    return 0
