"""specstream's configuration: one YAML file, validated, with environment overrides.

Precedence, highest first: values passed to ``Settings(...)`` in code, then
environment variables ``SPECSTREAM_<SECTION>__<KEY>`` (``__`` nests, e.g.
``SPECSTREAM_ENGINE__SPECULATION__ENABLED=false``), then the YAML file, then
the defaults below. Every model forbids unknown keys so a typo fails at start
instead of being silently ignored.

:func:`load_settings` is the one entry point processes use; it turns every
problem (unreadable file, bad YAML, unknown key, bad value) into a
:class:`ConfigError` whose message is one line naming the key, which the CLI
prints as ``config error: ...`` before exiting with status 2.
"""
from __future__ import annotations

import contextvars
import os
import re
import socket
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict, SettingsError

from schemas.topics import TopicCatalog

if TYPE_CHECKING:
    from engine.config import EngineConfig

ENV_PREFIX = "SPECSTREAM_"
ENV_NESTED_DELIMITER = "__"
DEFAULT_CONFIG_FILE = Path("specstream.yaml")
CONFIG_FILE_ENV = "SPECSTREAM_CONFIG"
DEFAULT_MODEL = "smollm2-135m-instruct"
MIB = 1024 * 1024

_TOPIC_SAFE = r"^[a-zA-Z0-9._-]+$"
_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "kib": 1024, "m": 1000**2, "mb": 1000**2, "mib": 1024**2,
          "g": 1000**3, "gb": 1000**3, "gib": 1024**3}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


class ConfigError(Exception):
    """A configuration problem, described in one line that names the offending key."""


def _parse_size(value: Any) -> Any:
    """Accept byte sizes as numbers or as strings like ``512MiB`` / ``2GB`` (binary and decimal units)."""
    if isinstance(value, str):
        match = _SIZE_RE.match(value)
        if match is None or match.group(2).lower() not in _UNITS:
            raise ValueError(f"expected a byte size such as 1048576, 512KiB or 2GB, got {value!r}")
        return int(float(match.group(1)) * _UNITS[match.group(2).lower()])
    return value


ByteSize = Annotated[int, BeforeValidator(_parse_size)]


class Section(BaseModel):
    # Frozen: settings are read by several threads (engine driver, event loop).
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)


class KafkaSettings(Section):
    bootstrap_servers: str = Field(
        default="127.0.0.1:9092", min_length=1, description="Comma-separated host:port list of Kafka brokers."
    )
    topic_prefix: str = Field(
        default="specstream", max_length=150, pattern=_TOPIC_SAFE,
        description="Prefix of every topic name, so several deployments can share a cluster.",
    )
    request_partitions: int = Field(
        default=6, ge=1, le=1000, description="Partitions of the request topic: the most workers that can share the load."
    )
    replication_factor: int = Field(default=1, ge=1, description="Replicas of each topic (3 on a production cluster).")
    min_insync_replicas: int = Field(
        default=1, ge=1, description="Replicas that must hold a write before acks=all succeeds (2 with 3 replicas)."
    )
    manage_local: bool = Field(
        default=True,
        description="`specstream up` starts a local broker when bootstrap_servers names this machine, "
        "security_protocol is PLAINTEXT and none answers.",
    )
    local_port: int | None = Field(
        default=None, ge=1, le=65535,
        description="Port of the managed local broker; null: the port in bootstrap_servers.",
    )
    # Connection security, shared by every client of every service (streams.kafka_connection builds it).
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = Field(
        default="PLAINTEXT", description="PLAINTEXT, SSL (TLS), SASL_PLAINTEXT or SASL_SSL (SASL over TLS)."
    )
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER"] | None = Field(
        default=None, description="SASL mechanism (SASL_* protocols): PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 or OAUTHBEARER."
    )
    sasl_username: str | None = Field(default=None, min_length=1, description="SASL user (PLAIN, SCRAM).")
    sasl_password: SecretStr | None = Field(
        default=None, description="SASL password (PLAIN, SCRAM); give it as $SPECSTREAM_KAFKA__SASL_PASSWORD. Never printed."
    )
    sasl_oauth_token_provider: str | None = Field(
        default=None, pattern=r"^[\w.]+:[\w.]+$",
        description="OAUTHBEARER: 'module:name' of an aiokafka AbstractTokenProvider class or factory.",
    )
    ssl_cafile: str | None = Field(
        default=None, min_length=1, description="CA certificates (PEM) that sign the brokers'; null: the system's."
    )
    ssl_certfile: str | None = Field(default=None, min_length=1, description="Client certificate (PEM), for mutual TLS.")
    ssl_keyfile: str | None = Field(default=None, min_length=1, description="Private key (PEM) of ssl_certfile.")
    ssl_check_hostname: bool = Field(
        default=True, description="Check that a broker's certificate names the host connected to."
    )

    @property
    def uses_tls(self) -> bool:
        return self.security_protocol in ("SSL", "SASL_SSL")

    @property
    def uses_sasl(self) -> bool:
        return self.security_protocol.startswith("SASL_")

    @model_validator(mode="after")
    def _consistent(self) -> "KafkaSettings":
        if self.min_insync_replicas > self.replication_factor:
            raise ValueError(
                f"min_insync_replicas ({self.min_insync_replicas}) exceeds replication_factor ({self.replication_factor}):"
                " no write could ever succeed"
            )
        local = self.local_bootstrap_port
        if self.local_port is not None and local is not None and local != self.local_port:
            raise ValueError(
                f"local_port ({self.local_port}) differs from the port in bootstrap_servers ({local}); set only one"
            )
        self._check_security()
        return self

    def _check_security(self) -> None:
        protocol = self.security_protocol
        unused = [name for name, used in (
            ("sasl_mechanism", self.uses_sasl), ("sasl_username", self.uses_sasl), ("sasl_password", self.uses_sasl),
            ("sasl_oauth_token_provider", self.uses_sasl), ("ssl_cafile", self.uses_tls),
            ("ssl_certfile", self.uses_tls), ("ssl_keyfile", self.uses_tls),
        ) if getattr(self, name) is not None and not used]
        if unused:
            raise ValueError(f"{unused[0]} is set but security_protocol {protocol} does not use it")
        if self.uses_sasl and self.sasl_mechanism is None:
            raise ValueError(f"security_protocol {protocol} needs sasl_mechanism")
        if self.sasl_mechanism == "OAUTHBEARER" and self.sasl_oauth_token_provider is None:
            raise ValueError("sasl_mechanism OAUTHBEARER needs sasl_oauth_token_provider")
        if self.sasl_mechanism not in (None, "OAUTHBEARER"):
            missing = [name for name in ("sasl_username", "sasl_password") if getattr(self, name) is None]
            if missing:
                raise ValueError(f"sasl_mechanism {self.sasl_mechanism} needs {' and '.join(missing)}")
        if self.ssl_keyfile is not None and self.ssl_certfile is None:
            raise ValueError("ssl_keyfile is set without ssl_certfile")

    @property
    def local_bootstrap_port(self) -> int | None:
        """The port when bootstrap_servers is one address on this machine, else None."""
        servers = [s.strip() for s in self.bootstrap_servers.split(",") if s.strip()]
        if len(servers) != 1:
            return None
        host, _, port = servers[0].rpartition(":")
        if host.strip("[]") not in ("127.0.0.1", "localhost", "::1") or not port.isdigit():
            return None
        return int(port)

    @property
    def managed_port(self) -> int | None:
        """Port of the local broker `specstream up` should start, or None when Kafka is someone else's."""
        # The managed broker is the plain one; a secured local broker is started with `specstream kafka start --secure`.
        if not self.manage_local or self.security_protocol != "PLAINTEXT":
            return None
        return self.local_bootstrap_port


class SpeculationSettings(Section):
    enabled: bool = Field(default=True, description="Speculative decoding on by default; requests may turn it off.")
    method: Literal["ngram", "draft"] = Field(
        default="ngram", description="ngram: draft from the request's own text (no extra model); draft: a small draft model."
    )
    draft_model: str | None = Field(default=None, description="Name or path of the draft model (method: draft).")
    draft_sampling: Literal["greedy", "coupled", "sampled"] = Field(
        default="greedy",
        description="How a draft model drafts for sampled requests; greedy and coupled keep seeded text reproducible.",
    )
    max_draft_tokens: int = Field(default=8, gt=0, le=64, description="Most draft tokens verified per target forward.")
    adaptive: bool = Field(
        default=True,
        description="Adapt draft lengths to measured acceptance and step costs; false always drafts max_draft_tokens.",
    )
    min_acceptance: float = Field(
        default=0.3, ge=0.0, lt=1.0,
        description="Below this acceptance rate a sequence stops speculating (and probes again later).",
    )
    probe_interval_steps: int = Field(
        default=16, gt=0, description="Steps between probes of a sequence that stopped speculating."
    )
    ngram_min: int = Field(default=1, ge=1, description="Shortest n-gram matched when drafting (method: ngram).")
    ngram_max: int = Field(default=4, ge=1, description="Longest n-gram matched when drafting (method: ngram).")

    @model_validator(mode="after")
    def _consistent(self) -> "SpeculationSettings":
        if self.method == "draft" and not self.draft_model:
            raise ValueError("method 'draft' needs draft_model")
        if self.ngram_min > self.ngram_max:
            raise ValueError(f"ngram_min ({self.ngram_min}) exceeds ngram_max ({self.ngram_max})")
        return self


class EngineSettings(Section):
    model: str = Field(
        default=DEFAULT_MODEL, min_length=1,
        description="A known model name, a local Hugging Face model folder or a .gguf file.",
    )
    device: str = Field(
        default="auto", pattern=r"^(auto|cpu|cuda(:\d+)?)$", description="cpu, cuda, cuda:N, or auto (CUDA if present)."
    )
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        default="auto", description="Weights and KV cache dtype; auto picks one for the device."
    )
    max_model_len: int | None = Field(
        default=None, ge=16, description="Longest prompt + completion in tokens; null: min(model context, 2048)."
    )
    kv_cache_bytes: ByteSize | None = Field(
        default=None, gt=0, description="KV cache budget in bytes (e.g. 512MiB); wins over kv_cache_fraction."
    )
    kv_cache_fraction: float = Field(
        default=0.3, gt=0.0, le=0.95, description="KV cache budget as a fraction of free memory."
    )
    max_running_requests: int = Field(default=64, ge=1, description="Most requests decoded together in one batch.")
    max_batched_tokens: int = Field(default=512, ge=16, description="Most tokens (prefill + decode) in one engine step.")
    prepack_weights: bool = Field(
        default=True,
        description="CPU: keep a oneDNN-prepacked copy of the weights for steps of 4-48 rows "
        "(speculative verification, small batches); costs one more copy of the weights in memory.",
    )
    speculation: SpeculationSettings = Field(default_factory=SpeculationSettings)

    def to_engine_config(self) -> EngineConfig:
        """The engine's own (plain dataclass) configuration."""
        # Imported here: reading or checking a config must not import torch.
        from engine.config import EngineConfig, SpeculationConfig

        spec = self.speculation
        return EngineConfig(
            model=self.model,
            device=self.device,
            dtype=self.dtype,
            max_model_len=self.max_model_len,
            kv_cache_bytes=self.kv_cache_bytes,
            kv_cache_fraction=self.kv_cache_fraction,
            max_running_requests=self.max_running_requests,
            max_batched_tokens=self.max_batched_tokens,
            prepack_weights=self.prepack_weights,
            # Every setting is a field of the same name; the engine's tuning fields keep their defaults.
            speculation=SpeculationConfig(**spec.model_dump()),
        )


class WorkerSettings(Section):
    id: str | None = Field(
        default=None, min_length=1, max_length=128, pattern=_TOPIC_SAFE,
        description="Worker id in announcements and dead letters; null: <hostname>-<pid>.",
    )
    group_id: str | None = Field(
        default=None, min_length=1, description="Consumer group of the request topic; null: <topic_prefix>.engine-workers."
    )
    max_message_bytes: ByteSize = Field(
        default=MIB, ge=1024, description="Larger request messages are rejected (message_too_large) and dead-lettered."
    )
    heartbeat_s: float = Field(default=5.0, gt=0, description="Seconds between `ready` announcements on the workers topic.")
    max_inflight: int = Field(
        default=128, ge=1, description="Most requests held (running + queued); beyond it the worker stops reading requests."
    )
    drain_timeout_s: float = Field(
        default=30.0, ge=0, description="On shutdown, seconds to finish running requests before aborting the rest."
    )
    session_timeout_ms: int = Field(
        default=6000, ge=1000, le=300_000,
        description="Consumer-group session timeout: a worker killed without warning loses its request partitions "
        "to the others after this long (the broker's group.min.session.timeout.ms, 6000 by default, is the floor).",
    )
    heartbeat_interval_ms: int = Field(
        default=1000, ge=100, description="Consumer-group heartbeats; a rebalance reaches a worker within one of them."
    )

    def resolved_id(self) -> str:
        if self.id:
            return self.id
        host = re.sub(r"[^a-zA-Z0-9._-]+", "-", socket.gethostname()).strip("-.") or "worker"
        return f"{host}-{os.getpid()}"

    def resolved_group_id(self, topic_prefix: str) -> str:
        return self.group_id or f"{topic_prefix}.engine-workers"

    @model_validator(mode="after")
    def _heartbeat_below_session(self) -> "WorkerSettings":
        if self.heartbeat_interval_ms >= self.session_timeout_ms:
            raise ValueError(
                f"heartbeat_interval_ms ({self.heartbeat_interval_ms}) must be below session_timeout_ms "
                f"({self.session_timeout_ms})"
            )
        return self


class DeliverySettings(Section):
    reply_topic_patterns: list[str] = Field(
        default_factory=lambda: ["{prefix}.replies.*"], min_length=1,
        description="Topics a request may name as its reply_to (shell-style patterns; {prefix} is kafka.topic_prefix). "
        "Requests naming any other topic are dead-lettered as reply_topic_forbidden.",
    )
    publish_timeout_s: float = Field(
        default=10.0, gt=0, le=300,
        description="Most seconds a reply, rejection or dead letter may take to be acknowledged; one that takes longer "
        "is given up (a reply is dead-lettered) so no partition waits on it.",
    )
    topic_cache_ttl_s: float = Field(
        default=30.0, gt=0,
        description="How long a reply topic seen to exist is trusted before its metadata is looked up again.",
    )
    metadata_timeout_s: float = Field(
        default=2.0, gt=0, le=60,
        description="Bound on one metadata look-up of reply topics; if it fails (a broker failing over), the request is "
        "served and its bounded publish decides.",
    )

    @field_validator("reply_topic_patterns")
    @classmethod
    def _patterns_name_topics(cls, patterns: list[str]) -> list[str]:
        for pattern in patterns:
            if pattern.strip() in ("", "*", "{prefix}*", "{prefix}.*"):
                raise ValueError(
                    f"{pattern!r} would let requests write into any (internal) topic; name reply topics, "
                    "e.g. '{prefix}.replies.*'"
                )
        return patterns


class EdgeAuthSettings(Section):
    enabled: bool = Field(
        default=True, description="Require an API key on every API call; false: anyone may call (`specstream up` warns)."
    )
    keys_file: str | None = Field(
        default=None, description="Hashed API keys and tenant limits (`specstream keys`); null: ~/.config/specstream/keys.json."
    )
    key_hashes: list[str] = Field(
        default_factory=list,
        description="More keys as 'tenant:sha256-hex' entries, e.g. from the environment (`specstream keys hash`).",
    )


class EdgeLimitSettings(Section):
    rpm: int | None = Field(default=600, ge=1, description="Requests per minute of a tenant that sets none; null: no limit.")
    tpm: int | None = Field(
        default=500_000, ge=1, description="Tokens (prompt + max_tokens) per minute of a tenant that sets none; null: no limit."
    )
    concurrency: int | None = Field(
        default=32, ge=1, description="Requests in flight at once for a tenant that sets none; null: no limit."
    )


class EdgeSettings(Section):
    host: str = Field(default="127.0.0.1", min_length=1, description="Address the HTTP/websocket edge listens on.")
    port: int = Field(default=8000, ge=1, le=65535, description="Port the edge listens on.")
    edge_id: str | None = Field(
        default=None, min_length=1, max_length=64, pattern=_TOPIC_SAFE,
        description="Names this edge's reply topic <topic_prefix>.replies.<edge_id>; null: <hostname>-<port>.",
    )
    request_timeout_s: float | None = Field(
        default=120.0, gt=0, description="End-to-end limit of a request, sent as its deadline; null: none."
    )
    deadline_grace_s: float = Field(
        default=5.0, ge=0, description="Extra seconds the edge waits past a deadline for the worker's own reply."
    )
    ready_heartbeats: int = Field(
        default=3, ge=1, description="/readyz counts a worker alive within this many worker heartbeats."
    )
    max_tokens_default: int = Field(default=128, ge=1, le=32768, description="max_tokens when a client gives none.")
    startup_timeout_s: float = Field(default=30.0, gt=0, description="Seconds the edge waits for Kafka at start.")
    redis_url: str | None = Field(
        default=None, description="Redis for rate-limit counters shared by every edge; null: in memory, per edge."
    )
    max_body_bytes: ByteSize = Field(default=MIB, ge=1024, description="Larger HTTP request bodies get 413.")
    max_ws_frame_bytes: ByteSize = Field(
        default=MIB, ge=1024, description="Larger websocket frames close the socket with code 1009."
    )
    auth: EdgeAuthSettings = Field(default_factory=EdgeAuthSettings)
    limits: EdgeLimitSettings = Field(default_factory=EdgeLimitSettings)


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_nested_delimiter=ENV_NESTED_DELIMITER,
        extra="forbid",
        frozen=True,
        validate_default=True,
    )

    kafka: KafkaSettings = Field(default_factory=KafkaSettings)
    engine: EngineSettings = Field(default_factory=EngineSettings)
    worker: WorkerSettings = Field(default_factory=WorkerSettings)
    edge: EdgeSettings = Field(default_factory=EdgeSettings)
    delivery: DeliverySettings = Field(default_factory=DeliverySettings)
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field(default="INFO", description="Log level of every process.")

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # No .env or secrets files: one YAML file plus the environment is the whole story.
        return init_settings, env_settings, _YamlSource(settings_cls)

    @property
    def catalog(self) -> TopicCatalog:
        return TopicCatalog(prefix=self.kafka.topic_prefix, request_partitions=self.kafka.request_partitions)


# The file's contents for the Settings() call in progress. A context variable
# rather than a class attribute so concurrent loads (tests) cannot mix files.
_yaml_data: contextvars.ContextVar[dict[str, Any]] = contextvars.ContextVar("specstream_yaml_data", default={})


class _YamlSource(PydanticBaseSettingsSource):
    """Lowest-priority source: the YAML file read by :func:`load_settings`."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return _yaml_data.get().get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        return dict(_yaml_data.get())


def config_path(explicit: str | os.PathLike[str] | None = None) -> Path | None:
    """The file to read: the explicit one, else $SPECSTREAM_CONFIG, else ./specstream.yaml if present, else none."""
    if explicit is not None:
        return Path(explicit)
    from_env = os.environ.get(CONFIG_FILE_ENV)
    if from_env:
        return Path(from_env)
    return DEFAULT_CONFIG_FILE if DEFAULT_CONFIG_FILE.is_file() else None


def read_yaml(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise ConfigError(f"cannot read {path}: {error.strerror or error}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        problem = getattr(error, "problem", None) or str(error).splitlines()[0]
        raise ConfigError(f"{path}{where}: invalid YAML: {problem}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of sections (kafka, engine, worker, edge), got {type(data).__name__}")
    return data


def load_settings(path: str | os.PathLike[str] | None = None, **overrides: Any) -> Settings:
    """Read, merge and validate the configuration; raises :class:`ConfigError` with a one-line message."""
    file = config_path(path)
    data = read_yaml(file) if file is not None else {}
    token = _yaml_data.set(data)
    try:
        return Settings(**overrides)
    except ValidationError as error:
        raise ConfigError(describe_errors(error, file)) from None
    except SettingsError as error:
        # Raised for environment values that are not valid JSON for a complex field.
        raise ConfigError(str(error).splitlines()[0]) from None
    finally:
        _yaml_data.reset(token)


def describe_errors(error: ValidationError, file: Path | None = None) -> str:
    """One line naming each bad key, e.g. ``engine.speculation.max_draft_tokens: Input should be greater than 0``."""
    parts = []
    for item in error.errors(include_url=False):
        loc = tuple(str(p) for p in item["loc"])
        key = ".".join(loc)
        if item["type"] == "extra_forbidden":
            message = f"{key}: unknown key" + _known_keys_hint(loc[:-1])
        else:
            message = f"{key}: {str(item['msg']).removeprefix('Value error, ')}" if key else str(item["msg"])
        env_name = ENV_PREFIX + ENV_NESTED_DELIMITER.join(loc).upper()
        if loc and env_name in os.environ:
            message += f" (from ${env_name})"
        elif file is not None:
            message += f" (in {file})"
        parts.append(message)
    return "; ".join(parts)


def _known_keys_hint(section: tuple[str, ...]) -> str:
    model: type[BaseModel] = Settings
    for name in section:
        annotation = model.model_fields[name].annotation if name in model.model_fields else None
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            return ""
        model = annotation
    where = ".".join(section) or "top level"
    return f" (valid at {where}: {', '.join(model.model_fields)})"


# --- documentation generated from the models (config.example.yaml, README) --------------------------------------------


def _fields(model: type[BaseModel], prefix: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], FieldInfo]]:
    """Every leaf setting as (path, field), depth first in declaration order."""
    leaves: list[tuple[tuple[str, ...], FieldInfo]] = []
    for name, info in model.model_fields.items():
        annotation = info.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            leaves += _fields(annotation, (*prefix, name))
        else:
            leaves.append(((*prefix, name), info))
    return leaves


def _default(info: FieldInfo) -> Any:
    return info.get_default(call_default_factory=True)


def _yaml_scalar(value: Any) -> str:
    import json

    return json.dumps(value)  # JSON scalars are valid YAML: null, true, 8, 0.3, "text"


def example_yaml() -> str:
    """config.example.yaml: every key at its default, each with its description (kept in sync by a unit test)."""
    lines = [
        "# specstream configuration: every key with its default value.",
        "# Copy to ./specstream.yaml (read automatically) or pass --config FILE; delete what you do not change.",
        f"# Environment variables override the file: {ENV_PREFIX}<SECTION>{ENV_NESTED_DELIMITER}<KEY>, e.g.",
        f"#   {ENV_PREFIX}KAFKA{ENV_NESTED_DELIMITER}BOOTSTRAP_SERVERS=broker:9092",
        f"#   {ENV_PREFIX}ENGINE{ENV_NESTED_DELIMITER}SPECULATION{ENV_NESTED_DELIMITER}ENABLED=false",
        "# Unknown keys are errors. Check a file with: specstream config check FILE",
    ]
    opened: tuple[str, ...] = ()
    for path, info in _fields(Settings):
        section = path[:-1]
        for depth in range(len(section)):
            if opened[: depth + 1] != section[: depth + 1]:
                lines += ["", f"{'  ' * depth}{section[depth]}:"]
        opened = section
        indent = "  " * len(section)
        if not section:
            lines.append("")
        if info.description:
            lines.append(f"{indent}# {info.description}")
        lines.append(f"{indent}{path[-1]}: {_yaml_scalar(_default(info))}")
    return "\n".join(lines) + "\n"


def reference_markdown() -> str:
    """The README's configuration reference table (kept in sync by a unit test)."""
    rows = ["| key | default | environment variable | meaning |", "|---|---|---|---|"]
    for path, info in _fields(Settings):
        env_name = ENV_PREFIX + ENV_NESTED_DELIMITER.join(path).upper()
        description = (info.description or "").replace("|", "\\|")
        rows.append(f"| `{'.'.join(path)}` | `{_yaml_scalar(_default(info))}` | `{env_name}` | {description} |")
    return "\n".join(rows)
