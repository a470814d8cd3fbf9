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
from streams.config.docs import example_yaml, reference_markdown
from streams.config.engine import EngineSettings, SpeculationSettings
from streams.config.files import FilesSettings, ParserSettings
from streams.config.kafka import DeliverySettings, KafkaSettings
from streams.config.loading import (
    Settings,
    config_path,
    describe_errors,
    load_settings,
    read_yaml,
)
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
    "CONFIG_FILE_ENV", "DEFAULT_CONFIG_FILE", "DEFAULT_MODEL", "ENV_NESTED_DELIMITER", "ENV_PREFIX", "MIB",
    "ByteSize", "CandidateSampling", "ConfigError", "DeliverySettings", "EdgeAuthSettings", "EdgeLimitSettings",
    "EdgeSettings", "EngineSettings", "EvalSettings", "FilesSettings", "ParserSettings", "KafkaSettings", "MetricsSettings", "Section", "Settings",
    "SpeculationSettings", "TelemetrySettings", "TracingSettings", "WorkerSettings", "parse_byte_size", "config_path",
    "describe_errors", "example_yaml", "load_settings", "read_yaml", "reference_markdown",
]
