"""Loading the configuration: the YAML file, environment overrides, and one-line errors naming the key."""
from __future__ import annotations

import contextvars
import os
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, Field, ValidationError
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
)

from engine.config import EngineConfig
from schemas.topics import TopicCatalog
from streams.config.base import (
    CONFIG_FILE_ENV,
    DEFAULT_CONFIG_FILE,
    ENV_NESTED_DELIMITER,
    ENV_PREFIX,
    ConfigError,
)
from streams.config.batch import BatchSettings
from streams.config.files import FilesSettings, ParserSettings
from streams.config.kafka import DeliverySettings, KafkaSettings
from streams.config.ops import OpsSettings
from streams.config.rag import RagSettings
from streams.config.services import (
    EdgeSettings,
    EvalSettings,
    TelemetrySettings,
    WorkerSettings,
)
from streams.config.tools import ToolsSettings


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_nested_delimiter=ENV_NESTED_DELIMITER,
        extra="forbid",
        frozen=True,
        validate_default=True,
    )

    kafka: KafkaSettings = Field(default_factory=KafkaSettings)
    engine: EngineConfig = Field(default_factory=EngineConfig)
    worker: WorkerSettings = Field(default_factory=WorkerSettings)
    edge: EdgeSettings = Field(default_factory=EdgeSettings)
    delivery: DeliverySettings = Field(default_factory=DeliverySettings)
    eval: EvalSettings = Field(default_factory=EvalSettings)
    batch: BatchSettings = Field(default_factory=BatchSettings)
    telemetry: TelemetrySettings = Field(default_factory=TelemetrySettings)
    files: FilesSettings = Field(default_factory=FilesSettings)
    parser: ParserSettings = Field(default_factory=ParserSettings)
    ops: OpsSettings = Field(default_factory=OpsSettings)
    tools: ToolsSettings = Field(default_factory=ToolsSettings)
    rag: RagSettings = Field(default_factory=RagSettings)
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field(default="INFO", description="Log level of every process.")
    log_format: Literal["text", "json"] = Field(
        default="text", description="json: one JSON object per line, with request_id and trace_id on every line."
    )

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
        return TopicCatalog(prefix=self.kafka.topic_prefix, request_partitions=self.kafka.request_partitions,
                            completions_retention_ms=int(self.eval.completions_retention_h * 3_600_000),
                            tools_retention_ms=int(self.tools.retention_h * 3_600_000),
                            responses_retention_ms=int(self.edge.responses_retention_h * 3_600_000))


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


# --- documentation generated from the models (config.example.yaml, docs) ----------------------------------------------
