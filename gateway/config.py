"""Server settings: one typed object built from CLI flags and `SWITCHYARD_*` environment variables."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gateway.errors import ConfigError


class ServerConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    model_repository: Path = Field(Path("model_repository"), description="Folder of models, one sub-folder each.")
    host: str = Field("127.0.0.1", description="Interface to listen on; 0.0.0.0 for all (containers).")
    http_port: int = Field(8000, ge=0, le=65535, description="Port for /v1, /v2, /health and /metrics.")
    grpc_port: int = Field(8001, ge=0, le=65535, description="KServe v2 gRPC port; 0 disables gRPC.")
    metrics_port: int = Field(8002, ge=0, le=65535, description="Extra port serving only /metrics; 0 disables it.")
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    cache_dir: Path | None = Field(None, description="Where converted weights are cached (SWITCHYARD_CACHE_DIR).")
    max_body_bytes: int = Field(32 * 1024 * 1024, ge=1024, description="Larger request bodies get 413.")
    always_include_usage: bool = Field(
        False, description="Send the usage chunk on every stream, even when the client did not ask for it."
    )


def build_config(**values: object) -> ServerConfig:
    """Validate settings; on error, say which setting is wrong and how to fix it."""
    try:
        return ServerConfig(**{k: v for k, v in values.items() if v is not None})
    except ValidationError as exc:
        err = exc.errors()[0]
        name = str(err["loc"][0]) if err["loc"] else "?"
        raise ConfigError(
            f"setting '{name}' (flag --{name.replace('_', '-')}): {err['msg']}; run `switchyard serve --help`."
        ) from None
