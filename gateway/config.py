"""Server settings: one typed object built from CLI flags and `SWITCHYARD_*` environment variables."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError

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
    api_keys: tuple[SecretStr, ...] = Field((), description="Keys for inference routes; none = open inference.")
    admin_keys: tuple[SecretStr, ...] = Field((), description="Keys for the repository API; none = API disabled.")
    public_paths: tuple[str, ...] = Field(
        ("/health", "/v2/health/live", "/v2/health/ready", "/metrics"),
        description="Exact paths answered without a key (probes, scrapes).",
    )
    cors_allow_origins: tuple[str, ...] = Field((), description="Origins allowed by CORS; none = CORS off.")
    rate_limit_rpm: int = Field(0, ge=0, description="Requests per minute per key (per address without a key); 0 = off.")
    rate_limit_tpm: int = Field(0, ge=0, description="Prompt + generated tokens per minute per key; 0 = off.")
    drain_seconds: float = Field(30.0, ge=0, description="Grace period for in-flight requests after SIGTERM.")
    stream_send_timeout_secs: float = Field(
        30.0, gt=0, description="How long one send of a stream (SSE) may wait for a client that stopped reading; "
        "the stream is then closed and its generation aborted."
    )
    console: bool = Field(True, description="Serve the web console at / and /ui/ (--no-console turns it off).")
    log_format: Literal["text", "json"] = Field("text", description="json: one JSON object per log line.")
    model_control_mode: Literal["none", "explicit", "poll"] = Field(
        "none",
        description="Triton's model control: none = load every model at startup, repository load/unload refused; "
        "explicit = load only --load-model models, the repository API loads and unloads; poll = load every model, "
        "then apply the repository's changes every --repository-poll-secs.",
    )
    load_models: list[str] = Field(
        [], description="Explicit mode: models (folder names) loaded at startup; ['*'] = every model."
    )
    repository_poll_secs: float = Field(
        15.0, gt=0, description="Poll mode: seconds between two scans of the model repository (Triton's default 15)."
    )
    otlp_traces_endpoint: str | None = Field(
        None, description="OTLP/HTTP endpoint for a span per LLM request (e.g. http://collector:4318/v1/traces); "
        "none = tracing off."
    )


def _check_model_control(config: ServerConfig, given: dict[str, object]) -> None:
    """Settings that only make sense together (Triton's rules for --load-model and --repository-poll-secs)."""
    from gateway.repository.layout import is_valid_model_name

    mode = config.model_control_mode
    if config.load_models and mode != "explicit":
        raise ConfigError(f"--load-model is only used with --model-control-mode=explicit (the mode is '{mode}', which "
                          "loads every model); add --model-control-mode=explicit or drop --load-model.")
    if "*" in config.load_models and len(config.load_models) > 1:
        raise ConfigError("--load-model=* loads every model and must be the only --load-model; drop the others.")
    for name in config.load_models:
        if name != "*" and not is_valid_model_name(name):
            raise ConfigError(f"--load-model {name[:80]!r} is not a model name (a folder of the repository: letters, "
                              "digits, '.', '_' and '-'); use --load-model NAME once per model, or '*' for all.")
    if given.get("repository_poll_secs") is not None and mode != "poll":
        raise ConfigError(f"--repository-poll-secs is only used with --model-control-mode=poll (the mode is '{mode}'); "
                          "add --model-control-mode=poll or drop --repository-poll-secs.")


def build_config(**values: object) -> ServerConfig:
    """Validate settings; on error, say which setting is wrong and how to fix it."""
    try:
        config = ServerConfig(**{k: v for k, v in values.items() if v is not None})
        _check_model_control(config, values)
        return config
    except ValidationError as exc:
        err = exc.errors()[0]
        name = str(err["loc"][0]) if err["loc"] else "?"
        raise ConfigError(
            f"setting '{name}' (flag --{name.replace('_', '-')}): {err['msg']}; run `switchyard serve --help`."
        ) from None
