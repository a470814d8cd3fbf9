"""specstream's configuration: one YAML file, validated, with environment overrides.

Precedence, highest first: values passed to ``Settings(...)`` in code, then
environment variables ``SPECSTREAM_<SECTION>__<KEY>`` (``__`` nests, e.g.
``SPECSTREAM_ENGINE__SPECULATION__ENABLED=false``), then the YAML file, then
the defaults below. The ``engine`` section is the engine's own settings model
(engine.config.EngineConfig), each setting declared there once. Every model
forbids unknown keys so a typo fails at start instead of being silently ignored.

:func:`load_settings` is the one entry point processes use; it turns every
problem (unreadable file, bad YAML, unknown key, bad value) into a
:class:`ConfigError` whose message is one line naming the key, which the CLI
prints as ``config error: ...`` before exiting with status 2.
"""
from streams.config.base import (
    CONFIG_FILE_ENV,
    DEFAULT_CONFIG_FILE,
    DEFAULT_MODEL,
    ENV_NESTED_DELIMITER,
    ENV_PREFIX,
    MIB,
    ByteSize,
    ConfigError,
    Section,
    parse_byte_size,
)
from streams.config.batch import BatchAssemblerSettings, BatchSettings
from streams.config.docs import example_yaml, reference_markdown
from streams.config.files import FilesSettings, ParserSettings
from streams.config.kafka import DeliverySettings, KafkaSettings
from streams.config.loading import (
    Settings,
    config_path,
    describe_errors,
    load_settings,
    read_yaml,
)
from streams.config.ops import OpsSettings, RolloutSettings
from streams.config.services import (
    CandidateSampling,
    EdgeAuthSettings,
    EdgeLimitSettings,
    EdgeSettings,
    EvalSettings,
    MetricsSettings,
    TelemetrySettings,
    TracingSettings,
    WorkerSettings,
)

__all__ = [
    "BatchAssemblerSettings",
    "BatchSettings",
    "ByteSize",
    "CONFIG_FILE_ENV",
    "CandidateSampling",
    "ConfigError",
    "DEFAULT_CONFIG_FILE",
    "DEFAULT_MODEL",
    "DeliverySettings",
    "ENV_NESTED_DELIMITER",
    "ENV_PREFIX",
    "EdgeAuthSettings",
    "EdgeLimitSettings",
    "EdgeSettings",
    "EvalSettings",
    "FilesSettings",
    "KafkaSettings",
    "MIB",
    "MetricsSettings",
    "OpsSettings",
    "ParserSettings",
    "RolloutSettings",
    "Section",
    "Settings",
    "TelemetrySettings",
    "TracingSettings",
    "WorkerSettings",
    "config_path",
    "describe_errors",
    "example_yaml",
    "load_settings",
    "parse_byte_size",
    "read_yaml",
    "reference_markdown",
]
