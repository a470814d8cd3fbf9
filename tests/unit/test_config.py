"""One YAML file, validated, with SPECSTREAM_ environment overrides; every mistake is one line naming the key."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from streams import cli
from streams.config import (
    ConfigError,
    Settings,
    example_yaml,
    load_settings,
    reference_markdown,
)

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No SPECSTREAM_* variable or ./specstream.yaml from the developer's shell leaks into these tests."""
    for name in list(os.environ):
        if name.startswith("SPECSTREAM_"):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)


def write(tmp_path: Path, text: str, name: str = "specstream.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_without_a_file_the_defaults_apply() -> None:
    settings = load_settings()
    assert settings.kafka.bootstrap_servers == "127.0.0.1:9092"
    assert settings.kafka.managed_port == 9092
    assert settings.worker.max_message_bytes == 1024 * 1024
    assert (settings.edge.host, settings.edge.port) == ("127.0.0.1", 8000)
    assert settings.catalog.requests.name == "specstream.requests"


def test_the_file_in_the_working_directory_is_read(tmp_path: Path) -> None:
    write(tmp_path, "edge:\n  port: 9000\n")
    assert load_settings().edge.port == 9000


def test_the_engine_section_is_the_engines_configuration(tmp_path: Path) -> None:
    path = write(tmp_path, """
engine:
  model: /models/tiny
  device: cpu
  dtype: float32
  max_model_len: 1024
  kv_cache_bytes: 256MiB
  max_running_requests: 4
  max_batched_tokens: 256
  threads: 3
  speculation:
    enabled: false
    max_draft_tokens: 3
    min_acceptance: 0.5
    probe_interval_steps: 7
""")
    config = load_settings(path).engine
    assert (config.model, config.device, config.dtype, config.max_model_len) == ("/models/tiny", "cpu", "float32", 1024)
    assert config.kv_cache_bytes == 256 * 1024 * 1024
    assert (config.max_running_requests, config.max_batched_tokens, config.threads) == (4, 256, 3)
    spec = config.speculation
    assert (spec.enabled, spec.max_draft_tokens, spec.min_acceptance, spec.probe_interval_steps) == (False, 3, 0.5, 7)


def test_each_engine_setting_is_declared_once_in_the_engine() -> None:
    """The YAML's engine section is the engine's own model: a field added there is a key, an environment variable,
    a line of the example file and a row of the reference, with nothing to copy."""
    from engine.config import EngineConfig, LoRAConfig, SpeculationConfig

    assert Settings.model_fields["engine"].annotation is EngineConfig
    assert EngineConfig.model_fields["speculation"].annotation is SpeculationConfig
    assert EngineConfig.model_fields["lora"].annotation is LoRAConfig
    reference, example = reference_markdown(), example_yaml()
    for section, model in (("engine", EngineConfig), ("engine.speculation", SpeculationConfig),
                           ("engine.lora", LoRAConfig)):
        for name, info in model.model_fields.items():
            if name in ("speculation", "lora"):
                continue
            assert info.description, f"{section}.{name} needs a description: the docs are generated from it"
            env = "SPECSTREAM_" + f"{section}.{name}".replace(".", "__").upper()
            assert f"| `{section}.{name}` |" in reference and f"`{env}`" in reference
            assert f"# {info.description}\n" in example


def test_reading_the_configuration_does_not_import_torch(tmp_path: Path) -> None:
    code = "import sys; from streams.config import load_settings; load_settings(); assert 'torch' not in sys.modules"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path,
                          env=_env_with_repo())
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("engine:\n  speculation:\n    max_draft_tokens: 0\n",
         "engine.speculation.max_draft_tokens: Input should be greater than 0"),
        ("engine:\n  max_draft_tokens: 3\n", "engine.max_draft_tokens: unknown key"),
        ("engine:\n  speculation:\n    min_acceptance: 1.0\n",
         "engine.speculation.min_acceptance: Input should be less than 1"),
        ("kafka:\n  bootstrap: x:1\n", "kafka.bootstrap: unknown key"),
        ("colour: blue\n", "colour: unknown key"),
        ("worker:\n  heartbeat_s: often\n", "worker.heartbeat_s: Input should be a valid number"),
        ("engine:\n  speculation:\n    method: magic\n", "engine.speculation.method: Input should be 'ngram', 'draft', 'eagle' or 'suffix'"),
        ("engine:\n  kv_cache_bytes: lots\n", "engine.kv_cache_bytes: expected a byte size"),
        ("engine:\n  threads: -1\n", "engine.threads: Input should be greater than or equal to 0"),
        ("engine:\n  weights: int3\n", "engine.weights: Input should be 'auto', 'fp32', 'bf16', 'int8', 'int4' or 'gguf'"),
        ("engine:\n  kernel_dispatch: fast\n", "engine.kernel_dispatch: Input should be 'auto' or 'fixed'"),
        ("kafka:\n  replication_factor: 1\n  min_insync_replicas: 2\n", "kafka: min_insync_replicas (2) exceeds"),
        ("engine:\n  speculation:\n    method: draft\n", "engine.speculation: method 'draft' needs draft_model"),
        ("engine:\n  speculation:\n    method: eagle\n", "engine.speculation: method 'eagle' needs draft_head"),
        ("engine:\n  speculation:\n    method: eagle\n    draft_head: ''\n", "engine.speculation.draft_head: String should"),
        ("kafka:\n  topic_prefix: 'has space'\n", "kafka.topic_prefix: String should match pattern"),
        ("engine: [1,\n", "line 2: invalid YAML"),
        ("- a list\n", "expected a mapping of sections"),
    ],
)
def test_mistakes_are_one_line_naming_the_key(tmp_path: Path, text: str, expected: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as error:
        load_settings(path)
    message = str(error.value)
    assert expected in message
    assert "\n" not in message


def test_cli_prints_config_error_and_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, "engine:\n  speculation:\n    max_draft_tokens: 0\n")
    assert cli.main(["--config", str(path), "worker"]) == 2
    err = capsys.readouterr().err
    assert err.splitlines() == [
        f"config error: engine.speculation.max_draft_tokens: Input should be greater than 0 (in {path})"
    ]


def test_console_script_has_no_traceback(tmp_path: Path) -> None:
    path = write(tmp_path, "worker:\n  max_mesage_bytes: 10\n")
    done = subprocess.run([sys.executable, "-m", "streams.cli", "config", "check", str(path)],
                          capture_output=True, text=True, cwd=tmp_path, env=_env_with_repo())
    assert done.returncode == 2
    assert done.stderr.startswith("config error: worker.max_mesage_bytes: unknown key")
    assert len(done.stderr.splitlines()) == 1
    assert "Traceback" not in done.stderr


def test_missing_file_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--config", str(tmp_path / "nope.yaml"), "config", "check"]) == 2
    assert "cannot read" in capsys.readouterr().err


def test_environment_overrides_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(tmp_path, "kafka:\n  bootstrap_servers: file:9092\n  topic_prefix: fromfile\n")
    monkeypatch.setenv("SPECSTREAM_KAFKA__BOOTSTRAP_SERVERS", "env:9092")
    monkeypatch.setenv("SPECSTREAM_ENGINE__SPECULATION__ENABLED", "false")
    monkeypatch.setenv("SPECSTREAM_WORKER__MAX_MESSAGE_BYTES", "2MiB")
    settings = load_settings(path)
    assert settings.kafka.bootstrap_servers == "env:9092"
    assert settings.kafka.topic_prefix == "fromfile"  # untouched keys of the section keep the file's value
    assert settings.engine.speculation.enabled is False
    assert settings.worker.max_message_bytes == 2 * 1024 * 1024
    assert settings.kafka.managed_port is None  # not a local address


def test_the_rollouts_prometheus_url_must_be_an_http_url(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECSTREAM_OPS__ROLLOUT__PROMETHEUS_URL", "prometheus:9090")
    with pytest.raises(ConfigError) as error:
        load_settings()
    assert str(error.value).startswith("ops.rollout.prometheus_url: expected an http(s) URL")
    monkeypatch.setenv("SPECSTREAM_OPS__ROLLOUT__PROMETHEUS_URL", "http://127.0.0.1:9090/")
    assert load_settings().ops.rollout.prometheus_url == "http://127.0.0.1:9090"


def test_bad_environment_value_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECSTREAM_EDGE__PORT", "eighty")
    with pytest.raises(ConfigError) as error:
        load_settings()
    assert str(error.value).startswith("edge.port: Input should be a valid integer")
    assert "$SPECSTREAM_EDGE__PORT" in str(error.value)


def test_unknown_environment_key_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECSTREAM_ENGINE__MAX_DRAFT_TOKENS", "4")
    with pytest.raises(ConfigError, match=r"engine.max_draft_tokens: unknown key .*SPECSTREAM_ENGINE__MAX_DRAFT_TOKENS"):
        load_settings()


def test_infra_variables_are_not_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    # infra.kafka reads these; they share the prefix but are not configuration keys.
    monkeypatch.setenv("SPECSTREAM_KAFKA_VERSION", "4.4.0")
    monkeypatch.setenv("SPECSTREAM_CACHE_DIR", "/tmp/x")
    monkeypatch.setenv("SPECSTREAM_KAFKA_PORT", "9099")
    assert load_settings() == Settings()


def test_config_file_from_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(tmp_path, "edge:\n  port: 8123\n", name="other.yaml")
    monkeypatch.setenv("SPECSTREAM_CONFIG", str(path))
    assert load_settings().edge.port == 8123


def test_local_port_must_agree_with_bootstrap(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="local_port"):
        load_settings(write(tmp_path, "kafka:\n  bootstrap_servers: 127.0.0.1:9092\n  local_port: 9093\n"))
    settings = load_settings(write(tmp_path, "kafka:\n  bootstrap_servers: localhost:19092\n"))
    assert settings.kafka.managed_port == 19092
    assert load_settings(write(tmp_path, "kafka:\n  manage_local: false\n")).kafka.managed_port is None


def test_example_file_is_the_generated_one_and_holds_the_defaults() -> None:
    example = REPO / "config.example.yaml"
    assert example.read_text() == example_yaml(), "regenerate: specstream config example > config.example.yaml"
    assert load_settings(example) == Settings()


def test_the_docs_reference_tables_are_the_generated_ones() -> None:
    from streams.commands.doc_tables import replace_table

    configuration = (REPO / "docs" / "configuration.md").read_text()
    assert replace_table(configuration, reference_markdown()) == configuration, \
        "regenerate: specstream config reference --write docs/configuration.md"
    topics = (REPO / "docs" / "topics.md").read_text()
    assert replace_table(topics, Settings().catalog.markdown()) == topics, \
        "regenerate: specstream topics markdown --write docs/topics.md"


def test_config_reference_write_replaces_a_stale_table_and_keeps_the_prose(tmp_path: Path) -> None:
    page = tmp_path / "configuration.md"
    page.write_text("# Configuration\n\nBefore.\n\n| key | default | environment variable | meaning |\n|---|---|---|---|\n"
                    "| `gone.key` | `1` | `SPECSTREAM_GONE__KEY` | A setting that no longer exists. |\n\nAfter.\n")
    assert cli.main(["--config", os.devnull, "config", "reference", "--write", str(page)]) == 0
    assert page.read_text() == f"# Configuration\n\nBefore.\n\n{reference_markdown()}\n\nAfter.\n"


def test_config_reference_write_into_a_page_without_the_table_names_the_missing_header(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    page = tmp_path / "notes.md"
    page.write_text("# Notes\n")
    assert cli.main(["--config", os.devnull, "config", "reference", "--write", str(page)]) == 2
    assert "no table with the header row '| key | default |" in capsys.readouterr().err
    assert page.read_text() == "# Notes\n"


def _env_with_repo() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPECSTREAM_")}
    env["PYTHONPATH"] = str(REPO)
    return env
