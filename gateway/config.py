"""Server settings, declared once.

Each field of `ServerConfig` is one setting: its type, default and checks, one help text, and (through `setting()`)
how it is given on the command line and in the environment. The flag is `--` + the name with dashes and the
environment variable `SWITCHYARD_` + the name in capitals unless the field says otherwise; `gateway/cli.py` builds
the `switchyard serve` parser from these declarations, and `gateway/server/settings_table.py` writes the table of
docs/configuration.md from them. Adding a setting is adding a field here.
"""

from __future__ import annotations

import typing
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ByteSize,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic.fields import FieldInfo

from gateway.errors import ConfigError
from gateway.repository.lifecycle_config import KeepAlive

ENV_PREFIX = "SWITCHYARD_"
ACCESS = "access control (docs/deployment.md)"
CONTROL = "model control, Triton's modes (docs/deployment.md)"
LIMITER = "rate limiter, Triton's (docs/frameworks.md)"
RESPONSES = "stored responses, /v1/responses with store: true (docs/agent-apis.md)"
BATCH = "files and batches, /v1/files and /v1/batches (docs/batch-api.md)"
KEYS = "named API keys with policies and usage (docs/keys.md)"


def setting(
    default: Any,
    help: str,  # noqa: A002 - argparse's word for it
    *,
    flag: str | None = None,
    env: str | None = None,
    env_aliases: tuple[str, ...] = (),
    flag_aliases: tuple[str, ...] = (),
    no_flag: bool = False,
    metavar: str | None = None,
    default_text: str | None = None,
    group: str | None = None,
    combine: bool = False,
    doc: str | None = None,
    **checks: Any,
) -> Any:
    """A `ServerConfig` field with its command line and environment spelling.

    `flag`, `env`: only where they differ from the derived `--name-with-dashes` and `SWITCHYARD_NAME`;
    `env_aliases`, `flag_aliases`: older spellings still accepted (the canonical one is documented);
    `no_flag`: environment only (secrets that should not show in `ps`); `metavar`: the value's name in --help;
    `default_text`: the default in words where the value does not say it; `group`: the --help section;
    `combine`: list values from the flag and the environment are joined instead of the flag winning;
    `doc`: the docs/ page that explains it; `checks`: pydantic's constraints (`ge`, `gt`, `le`, ...).
    """
    cli = {
        "flag": flag,
        "env": env,
        "env_aliases": list(env_aliases),
        "flag_aliases": list(flag_aliases),
        "no_flag": no_flag,
        "metavar": metavar,
        "default_text": default_text,
        "group": group,
        "combine": combine,
        "doc": doc,
    }
    return Field(default, description=help, json_schema_extra={"cli": cli}, **checks)


class ServerConfig(BaseModel):
    """Every setting of `switchyard serve` (docs/configuration.md)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model_repository: Path = setting(Path("model_repository"), "folder of models, one sub-folder each", metavar="DIR")
    host: str = setting("127.0.0.1", "interface to listen on; `0.0.0.0` in containers")
    http_port: int = setting(8000, "port of `/v1`, `/v2`, `/health` and `/metrics`", ge=0, le=65535, metavar="PORT")
    grpc_port: int = setting(8001, "KServe v2 gRPC; 0 turns it off", ge=0, le=65535, metavar="PORT")
    metrics_port: int = setting(
        8002, "an extra port serving only `/metrics`; 0 turns it off", ge=0, le=65535, metavar="PORT"
    )
    log_level: Literal["debug", "info", "warning", "error"] = setting("info", "how much the server logs")
    log_format: Literal["text", "json"] = setting("text", "`json`: one JSON object per line, with the request id")
    cache_dir: Path = setting(
        Path.home() / ".cache" / "switchyard",
        "converted weights and built kernels",
        metavar="DIR",
        default_text="`~/.cache/switchyard`",
    )
    max_body_bytes: int = setting(32 * 2**20, "larger request bodies get 413", ge=1024, metavar="N")
    always_include_usage: bool = setting(
        False, "a usage chunk on every stream (LangChain does not ask for one when `base_url` is set)"
    )
    stream_send_timeout_secs: float = setting(
        30.0,
        "a stream whose client stopped reading is closed, and its generation aborted, once one send has "
        "waited this long",
        gt=0,
        env_aliases=("SWITCHYARD_STREAM_SEND_TIMEOUT_S",),
        metavar="SECONDS",
    )
    console: bool = setting(True, "serve the web console at `/` and `/ui/`", doc="console.md")
    drain_seconds: float = setting(
        30.0, "after SIGTERM, how long in-flight requests may take to finish", ge=0, metavar="SECONDS"
    )
    api_keys: tuple[SecretStr, ...] = setting(
        (),
        "API keys; without any, inference is open",
        flag="--api-key",
        metavar="KEY",
        combine=True,
        default_text="none",
        group=ACCESS,
    )
    api_key_file: Path | None = setting(
        None, "one API key per line (`#` starts a comment), added to the API keys", metavar="FILE", group=ACCESS
    )
    admin_keys: tuple[SecretStr, ...] = setting(
        (),
        "the repository API's keys; without one that API is disabled",
        no_flag=True,
        env_aliases=("SWITCHYARD_ADMIN_KEY",),
        default_text="none",
        group=ACCESS,
        combine=True,
    )
    admin_key_file: Path | None = setting(
        None, "one admin key per line, added to the admin keys", metavar="FILE", group=ACCESS
    )
    public_paths: tuple[str, ...] = setting(
        ("/health", "/v2/health/live", "/v2/health/ready", "/metrics"),
        "exact paths served without a key",
        flag="--public-path",
        metavar="PATH",
        default_text="the health routes and `/metrics`",
        group=ACCESS,
    )
    cors_allow_origins: tuple[str, ...] = setting(
        (),
        "browsers allowed from ORIGIN (`*` for any)",
        flag="--cors-allow-origin",
        metavar="ORIGIN",
        default_text="CORS off",
        group=ACCESS,
    )
    rate_limit_rpm: int = setting(
        0, "requests per minute per API key (per client address without keys); 0 = off", ge=0, metavar="N", group=ACCESS
    )
    rate_limit_tpm: int = setting(
        0, "prompt + generated tokens per minute per API key; 0 = off", ge=0, metavar="N", group=ACCESS
    )
    model_control_mode: Literal["none", "explicit", "poll", "on_demand"] = setting(
        "none",
        "`none`: load every model at startup, repository load/unload refused; `explicit`: load only "
        "--load-model models, the repository API loads and unloads; `poll`: load every model, then apply the "
        "repository's changes as they appear; `on_demand`: load each model on its first request, unload it once "
        "idle past its keep-alive",
        group=CONTROL,
        doc="deployment.md#model-control",
    )
    load_models: list[str] = setting(
        [],
        "explicit mode: models (folder names) loaded at startup (`*` = all)",
        flag="--load-model",
        env_aliases=("SWITCHYARD_LOAD_MODEL",),
        metavar="NAME",
        default_text="none",
        group=CONTROL,
    )
    repository_poll_secs: float = setting(
        15.0, "poll mode: seconds between two scans of the repository", gt=0, metavar="SECONDS", group=CONTROL
    )
    memory_budget: ByteSize | None = setting(
        None,
        "memory the server may hold, models included (e.g. 12GiB, 800MB): to load a model, idle ones are "
        "evicted least recently used first; a model that cannot fit is refused with the figures",
        metavar="BYTES",
        default_text="the cgroup's memory limit, else the machine's memory",
        group=CONTROL,
        doc="model-management.md",
    )
    keep_alive: KeepAlive = setting(
        300.0,
        "how long a model loaded on request stays loaded once idle: seconds or a duration (90s, 5m, 1h), 0 "
        "unloads as soon as it is idle, -1 never; a model's own `keep_alive` wins",
        metavar="DURATION",
        default_text="5m",
        group=CONTROL,
        doc="model-management.md",
    )
    load_timeout_secs: float = setting(
        600.0,
        "how long a request waits for its model to load (503 after it; a shorter timeout the client sends gets 504)",
        gt=0,
        metavar="SECONDS",
        group=CONTROL,
    )
    exit_on_error: bool = setting(
        False,
        "stop the server when a model fails to load at startup (Triton's flag); without it the failure is "
        "reported in /v2/repository/index and the other models serve",
        group=CONTROL,
    )
    responses_store: Path | None = setting(
        None,
        "SQLite file keeping stored `/v1/responses`",
        metavar="FILE",
        default_text="responses.sqlite3 in the cache dir",
        group=RESPONSES,
        doc="agent-apis.md",
    )
    responses_max_stored: int = setting(
        10_000, "stored responses kept; past this the oldest go first", ge=1, metavar="N", group=RESPONSES
    )
    responses_max_bytes: int = setting(
        1 << 30,
        "bytes of stored responses kept; past this the oldest go first",
        ge=1 << 20,
        metavar="N",
        default_text="1 GiB",
        group=RESPONSES,
    )
    responses_ttl_secs: float = setting(
        30 * 86400.0,
        "stored responses expire after this many seconds",
        gt=0,
        metavar="SECONDS",
        default_text="30 days",
        group=RESPONSES,
    )
    rate_limit: Literal["off", "execution_count"] = setting(
        "off",
        "`execution_count`: a tensor model instance executes only while it holds the resources its "
        "instance_group's rate_limiter lists, turns weighted by priority",
        group=LIMITER,
        doc="frameworks.md",
    )
    rate_limit_resources: tuple[str, ...] = setting(
        (),
        "how much of a rate-limiter resource there is",
        flag="--rate-limit-resource",
        metavar="NAME:COUNT[:DEVICE]",
        default_text="the largest count any instance asks for",
        group=LIMITER,
    )
    otlp_traces_endpoint: str | None = setting(
        None,
        "send a span per LLM request (queue, prefill, decode) over OTLP/HTTP to URL, e.g. "
        "http://collector:4318/v1/traces; needs switchyard[tracing]",
        metavar="URL",
        default_text="off",
        doc="scale-out.md#tracing",
    )
    files_dir: Path | None = setting(
        None,
        "folder keeping uploaded files, batch output files and their SQLite database",
        metavar="DIR",
        default_text="files/ in the cache dir",
        group=BATCH,
        doc="batch-api.md",
    )
    files_max_bytes: int = setting(
        200 * 2**20,
        "largest file `POST /v1/files` accepts; larger uploads get 413",
        ge=1024,
        metavar="N",
        default_text="200 MiB",
        group=BATCH,
    )
    batch_max_requests: int = setting(50_000, "most requests in one batch's input file", ge=1, metavar="N", group=BATCH)
    batch_max_concurrency: int = setting(
        16,
        "batch requests running at once, all batches together; each starts only while no request waits for "
        "its model, at the lowest priority",
        ge=1,
        metavar="N",
        group=BATCH,
    )
    key_store: Path | None = setting(
        None,
        "SQLite file of the named API keys (/admin/keys) and their usage",
        metavar="FILE",
        default_text="keys.sqlite3 in the cache dir",
        group=KEYS,
        doc="keys.md",
    )
    key_store_url: SecretStr | None = setting(
        None,
        "a SQLAlchemy database URL used instead of --key-store, e.g. postgresql+psycopg://user:pw@host/db for "
        "replicas sharing keys and budgets (install its driver)",
        no_flag=True,
        default_text="none",
        group=KEYS,
    )
    key_usage_flush_secs: float = setting(
        5.0, "seconds between two writes of the keys' usage to the key store", gt=0, metavar="SECONDS", group=KEYS
    )
    key_refresh_secs: float = setting(
        10.0, "seconds between two reads of the keys changed by other replicas", gt=0, metavar="SECONDS", group=KEYS
    )
    key_prices: tuple[str, ...] = setting(
        (),
        "price per million prompt, completion and cached prompt tokens of a model, for usage's cost and cost budgets",
        flag="--key-price",
        metavar="MODEL=PROMPT:COMPLETION[:CACHED]",
        default_text="none",
        group=KEYS,
    )
    key_metrics_by_key: bool = setting(
        False,
        "label the /metrics series of named keys by key (one series per key and model; off: per model)",
        group=KEYS,
    )
    lora_dirs: tuple[Path, ...] = setting(
        (),
        "a folder LoRA adapters may be loaded from, besides each model's own folder",
        flag="--lora-dir",
        metavar="DIR",
        default_text="none",
        doc="lora.md",
    )

    @field_validator("lora_dirs")
    @classmethod
    def _lora_dirs_exist(cls, value: tuple[Path, ...]) -> tuple[Path, ...]:
        for folder in value:
            if not folder.is_dir():
                raise ValueError(f"--lora-dir {str(folder)[:200]} is not a directory; create it or drop the flag")
        return value

    routes_file: Path | None = setting(
        None,
        "YAML file of model routes: aliases, ordered fallbacks, weighted splits, retries with backoff",
        flag="--routes",
        env="SWITCHYARD_ROUTES",
        metavar="FILE",
        default_text="none",
        doc="routes.md",
    )
    malloc_arenas: int = setting(
        2,
        "malloc arenas the server's threads share (glibc only; 0 = glibc's default, 8 per core): each keeps the "
        "most its threads ever held, so more of them hold more memory outside the models; MALLOC_ARENA_MAX in "
        "the environment wins over the default",
        ge=0,
        le=1024,
        metavar="N",
        doc="reliability.md#soak",
    )

    @field_validator("log_level", "log_format", "model_control_mode", "rate_limit", mode="before")
    @classmethod
    def _lower_case(cls, value: Any) -> Any:
        return value.lower() if isinstance(value, str) else value

    @model_validator(mode="before")
    @classmethod
    def _read_key_files(cls, values: Any) -> Any:
        """Keys from --api-key-file and --admin-key-file join the keys given directly."""
        if not isinstance(values, dict):
            return values
        values = dict(values)
        for file_field, keys_field, what in (
            ("api_key_file", "api_keys", "API key"),
            ("admin_key_file", "admin_keys", "admin key"),
        ):
            if values.get(file_field) is not None:
                values[keys_field] = (*values.get(keys_field, ()), *_read_keys(Path(values[file_field]), what))
        return values

    @model_validator(mode="after")
    def _check_model_control(self) -> ServerConfig:
        """Settings that only make sense together (Triton's rules for --load-model and --repository-poll-secs)."""
        from gateway.repository.layout import is_valid_model_name

        mode = self.model_control_mode
        if self.load_models and mode != "explicit":
            raise ConfigError(
                f"--load-model is only used with --model-control-mode=explicit (the mode is '{mode}', "
                "which loads every model); add --model-control-mode=explicit or drop --load-model."
            )
        if "*" in self.load_models and len(self.load_models) > 1:
            raise ConfigError("--load-model=* loads every model and must be the only --load-model; drop the others.")
        for name in self.load_models:
            if name != "*" and not is_valid_model_name(name):
                raise ConfigError(
                    f"--load-model {name[:80]!r} is not a model name (a folder of the repository: "
                    "letters, digits, '.', '_' and '-'); use --load-model NAME once per model, or '*' "
                    "for all."
                )
        if "repository_poll_secs" in self.model_fields_set and mode != "poll":
            raise ConfigError(
                f"--repository-poll-secs is only used with --model-control-mode=poll (the mode is "
                f"'{mode}'); add --model-control-mode=poll or drop --repository-poll-secs."
            )
        return self


def _read_keys(path: Path, what: str) -> list[str]:
    """Keys from a file, one per line; a clear ConfigError if it cannot be read."""
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise ConfigError(
            f"cannot read the {what} file {path}: {exc.strerror}; check the path and permissions."
        ) from exc
    keys = [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]
    if not keys:
        raise ConfigError(f"the {what} file {path} holds no key; write one key per line.")
    return keys


@dataclass(frozen=True)
class Setting:
    """How one `ServerConfig` field is spelled outside Python, derived from its declaration."""

    name: str
    help: str
    flag: str | None  # None: environment only
    flag_aliases: tuple[str, ...]
    env: str
    env_aliases: tuple[str, ...]
    kind: Literal["value", "bool", "list"]
    choices: tuple[str, ...] | None
    default: Any
    default_text: str | None
    metavar: str | None
    group: str | None
    combine: bool
    doc: str | None
    secret: bool

    @property
    def envs(self) -> tuple[str, ...]:
        return (self.env, *self.env_aliases)

    @property
    def shown_default(self) -> str:
        """The default as a person reads it (--help and the docs' table)."""
        if self.default_text is not None:
            return self.default_text
        value = self.default
        if isinstance(value, bool):
            return "on" if value else "off"
        if value is None or value in ((), []):
            return "none"
        if isinstance(value, float):
            return f"{value:g}"
        return str(value) if isinstance(value, int) else f"`{value}`"


def _kind(annotation: Any) -> tuple[Literal["value", "bool", "list"], tuple[str, ...] | None]:
    """How a field's type is given: a value (with its choices, for a Literal), a switch, or a repeatable list."""
    if annotation is bool:
        return "bool", None
    if typing.get_origin(annotation) is Literal:
        return "value", typing.get_args(annotation)
    if typing.get_origin(annotation) in (list, tuple):
        return "list", None
    return "value", None


def _setting(name: str, field: FieldInfo) -> Setting:
    """A field's spellings: the declared ones, else derived from its name."""
    cli: dict[str, Any] = field.json_schema_extra["cli"]  # type: ignore[index,assignment]  # set by setting()
    kind, choices = _kind(field.annotation)
    return Setting(
        name=name,
        help=field.description or "",
        flag=None if cli["no_flag"] else cli["flag"] or "--" + name.replace("_", "-"),
        flag_aliases=tuple(cli["flag_aliases"]),
        env=cli["env"] or ENV_PREFIX + name.upper(),
        env_aliases=tuple(cli["env_aliases"]),
        kind=kind,
        choices=choices,
        default=field.default,
        default_text=cli["default_text"],
        metavar=cli["metavar"],
        group=cli["group"],
        combine=cli["combine"],
        doc=cli["doc"],
        secret=SecretStr in typing.get_args(field.annotation),
    )


def _settings() -> dict[str, Setting]:
    undeclared = [n for n, f in ServerConfig.model_fields.items() if "cli" not in (f.json_schema_extra or {})]
    if undeclared:
        raise TypeError(f"ServerConfig fields {undeclared} are not declared with setting(...); declare them so")
    return {name: _setting(name, field) for name, field in ServerConfig.model_fields.items()}


#: Every setting, in declaration order (the order of --help and of the docs' table).
SETTINGS: dict[str, Setting] = _settings()


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _explain(exc: ValidationError, sources: Mapping[str, str]) -> str:
    """One line per wrong setting: where it came from, what is wrong, and how to fix it."""
    problems = []
    for err in exc.errors():
        name = str(err["loc"][0]) if err["loc"] else "?"
        spec = SETTINGS.get(name)
        if spec is None:
            problems.append(f"there is no setting '{name}'; `switchyard serve --help` lists them")
            continue
        where = sources.get(name) or " or ".join(s for s in (spec.flag, spec.env) if s)
        got = "" if spec.secret else f" (got {_shown(err['input'])})"
        problems.append(
            f"setting '{name}' ({where}): {err['msg']}{got}; give {where} a valid value "
            "(`switchyard serve --help` explains each setting)"
        )
    return "; ".join(problems) + "."


def build_config(sources: Mapping[str, str] | None = None, /, **values: Any) -> ServerConfig:
    """Validate settings (None = not given); on error, say which setting is wrong, where it came from and the fix.

    `sources`: setting name -> where its value came from (`--http-port`, `SWITCHYARD_HTTP_PORT`), for the messages.
    """
    try:
        return ServerConfig(**{k: v for k, v in values.items() if v is not None})
    except ValidationError as exc:
        raise ConfigError(_explain(exc, sources or {})) from None


def build_rate_limiter(config: ServerConfig):  # noqa: ANN201 - RateLimiter | None, imported lazily
    """The server's rate limiter, or None when --rate-limit is off (resources given without it are an error)."""
    from gateway.scheduler.tensor.rate_limiter import RateLimiter, ResourceLimit

    if config.rate_limit == "off":
        if config.rate_limit_resources:
            raise ConfigError("--rate-limit-resource needs --rate-limit=execution_count; add it or drop the resources.")
        return None
    return RateLimiter([ResourceLimit.parse(text) for text in config.rate_limit_resources])
