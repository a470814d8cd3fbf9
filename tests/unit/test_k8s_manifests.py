"""infra/k8s: every overlay renders, validates offline, and says what the deployment needs.

The overlays are copied to a temporary folder and generated there (KafkaTopics from the catalog, the ScaledObject
from autoscale.yaml), then rendered by the real kustomize (or kubectl's) and checked: built-in kinds strictly against
Kubernetes' schemas (kubernetes-validate), KafkaTopic and ScaledObject against their CRDs' spec schemas; Kafka and
KafkaNodePool are skipped with the reason stated.
"""
from __future__ import annotations

import copy
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from streams.config import load_settings
from streams.ops.kustomize import KUSTOMIZE_VERSION, KustomizeError, build
from streams.ops.manifest_checks import check, policy_problems
from streams.ops.manifests import ManifestError, generate, read_policy

K8S = Path(__file__).resolve().parents[2] / "infra" / "k8s"
OVERLAYS = ["dev", "prod"]


def rendered(tmp_path: Path, overlay: str) -> list[dict[str, Any]]:
    root = tmp_path / "k8s"
    shutil.copytree(K8S, root, ignore=shutil.ignore_patterns("generated"))
    folder = root / "overlays" / overlay
    generate(folder, load_settings(str(folder / "specstream.yaml")))
    return build(folder)


def find(resources: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    return next(r for r in resources if r["kind"] == kind and r["metadata"]["name"] == name)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_resource_of_the_overlay_is_valid_or_skipped_with_a_reason(tmp_path: Path, overlay: str) -> None:
    resources = rendered(tmp_path, overlay)
    results = [check(r) for r in resources]
    assert [r for r in results if r.outcome == "invalid"] == []
    assert {r.kind for r in results if r.outcome == "skipped"} == {"Kafka", "KafkaNodePool"}
    assert all(r.detail for r in results if r.outcome == "skipped")
    assert policy_problems(resources) == []
    kinds = {r["kind"] for r in resources}
    assert {"Deployment", "Service", "PodDisruptionBudget", "ConfigMap", "Kafka", "KafkaTopic", "ScaledObject"} <= kinds
    namespace = yaml.safe_load((K8S / "overlays" / overlay / "kustomization.yaml").read_text())["namespace"]
    assert all(r["metadata"]["namespace"] == namespace for r in resources)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_topics_are_the_catalog_with_the_overlays_replication(tmp_path: Path, overlay: str) -> None:
    settings = load_settings(str(K8S / "overlays" / overlay / "specstream.yaml"))
    topics = {r["metadata"]["name"]: r["spec"] for r in rendered(tmp_path, overlay) if r["kind"] == "KafkaTopic"}
    catalog = settings.catalog
    assert sorted(topics) == sorted(t.name for t in catalog.shared_topics())
    requests = topics[catalog.requests.name]
    assert requests["partitions"] == settings.kafka.request_partitions
    assert requests["replicas"] == settings.kafka.replication_factor
    assert requests["config"]["min.insync.replicas"] == str(settings.kafka.min_insync_replicas)
    assert topics[catalog.services.name]["config"]["cleanup.policy"] == "compact"


def test_prod_scales_gpu_workers_by_the_request_topics_lag_up_to_its_partitions(tmp_path: Path) -> None:
    resources = rendered(tmp_path, "prod")
    settings = load_settings(str(K8S / "overlays" / "prod" / "specstream.yaml"))
    spec = find(resources, "ScaledObject", "specstream-worker")["spec"]
    trigger = spec["triggers"][0]["metadata"]
    assert (trigger["topic"], trigger["consumerGroup"]) == ("specstream.requests", "specstream.engine-workers")
    assert trigger["bootstrapServers"] == "specstream-kafka-bootstrap:9092"  # Strimzi's bootstrap Service
    assert spec["maxReplicaCount"] == settings.kafka.request_partitions and spec["minReplicaCount"] == 1
    worker = find(resources, "Deployment", "specstream-worker")["spec"]["template"]["spec"]["containers"][0]
    assert worker["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert {e["name"] for e in worker["env"]} >= {"SPECSTREAM_CONFIG", "SPECSTREAM_WORKER__ID"}  # merged, not lost
    # GPU workers run vLLM's engine, from the image that has vLLM's CUDA build; the other services keep the plain one.
    assert settings.engine.backend == "vllm" and settings.engine.device == "cuda"
    assert worker["image"] == "ghcr.io/specstream/specstream-vllm:0.1.0"
    edge = find(resources, "Deployment", "specstream-edge")
    assert edge["spec"]["template"]["spec"]["containers"][0]["image"] == "ghcr.io/specstream/specstream:0.1.0"
    assert edge["spec"]["replicas"] == 3
    assert find(resources, "KafkaNodePool", "dual-role")["spec"]["replicas"] == 3


def test_dev_scales_to_zero_only_because_its_policy_asks(tmp_path: Path) -> None:
    spec = find(rendered(tmp_path, "dev"), "ScaledObject", "specstream-worker")["spec"]
    assert spec["minReplicaCount"] == 0 and read_policy(K8S / "overlays" / "dev" / "autoscale.yaml").min_replicas == 0


def test_strict_validation_rejects_a_misspelled_field(tmp_path: Path) -> None:
    edge = copy.deepcopy(find(rendered(tmp_path, "dev"), "Deployment", "specstream-edge"))
    container = edge["spec"]["template"]["spec"]["containers"][0]
    container["readinesProbe"] = container.pop("readinessProbe")
    result = check(edge)
    assert result.outcome == "invalid" and "readinesProbe" in result.detail


def test_a_scaled_object_whose_trigger_metadata_is_not_strings_fails_kedas_schema(tmp_path: Path) -> None:
    scaler = copy.deepcopy(find(rendered(tmp_path, "dev"), "ScaledObject", "specstream-worker"))
    assert check(scaler).outcome == "valid"
    scaler["spec"]["triggers"][0]["metadata"]["lagThreshold"] = 8  # KEDA reads every metadata value as a string
    result = check(scaler)
    assert result.outcome == "invalid" and "triggers.0.metadata.lagThreshold" in result.detail


def test_a_topic_with_zero_partitions_fails_strimzis_schema(tmp_path: Path) -> None:
    topic = copy.deepcopy(next(r for r in rendered(tmp_path, "dev") if r["kind"] == "KafkaTopic"))
    topic["spec"]["partitions"] = 0
    assert check(topic).outcome == "invalid"


def test_a_secret_written_into_a_manifest_and_a_worker_without_drain_are_problems(tmp_path: Path) -> None:
    resources = rendered(tmp_path, "dev")
    edge = find(resources, "Deployment", "specstream-edge")["spec"]["template"]["spec"]["containers"][0]
    edge["env"].append({"name": "SPECSTREAM_EDGE__AUTH__KEY_HASHES", "value": "local:abc"})
    worker = find(resources, "Deployment", "specstream-worker")["spec"]["template"]["spec"]["containers"][0]
    del worker["lifecycle"]
    problems = policy_problems(resources)
    assert any("KEY_HASHES is written in the manifest" in p for p in problems)
    assert any("no preStop drain" in p for p in problems)


def test_a_kustomization_kustomize_refuses_is_an_error_that_names_what_is_missing(tmp_path: Path) -> None:
    (tmp_path / "kustomization.yaml").write_text("resources: [generated/kafka-topics.yaml]\n")
    with pytest.raises(KustomizeError, match="kafka-topics.yaml"):
        build(tmp_path)


def test_kustomize_features_beyond_a_subset_render_as_kubectl_apply_would(tmp_path: Path) -> None:
    (tmp_path / "cm.yaml").write_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\ndata: {a: b}\n")
    (tmp_path / "kustomization.yaml").write_text(
        "resources: [cm.yaml]\nnamePrefix: x-\nlabels: [{pairs: {team: llm}, includeSelectors: false}]\n")
    [config_map] = build(tmp_path)
    assert config_map["metadata"] == {"name": "x-c", "labels": {"team": "llm"}}


def test_without_kustomize_or_kubectl_the_error_says_how_to_install_it(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECSTREAM_CACHE_DIR", str(tmp_path / "empty-cache"))
    monkeypatch.setenv("PATH", str(tmp_path / "empty-path"))
    with pytest.raises(KustomizeError, match=f"go install sigs.k8s.io/kustomize/kustomize/v5@{KUSTOMIZE_VERSION}"):
        build(K8S / "overlays" / "dev")


def test_dev_installs_the_kustomize_version_the_code_names() -> None:
    assert f'KUSTOMIZE_VERSION="{KUSTOMIZE_VERSION}"' in (K8S.parents[1] / "dev").read_text()


def test_an_autoscale_file_with_an_unknown_key_names_it(tmp_path: Path) -> None:
    path = tmp_path / "autoscale.yaml"
    path.write_text("min_replicas: 1\nmax_replicaz: 4\n")
    with pytest.raises(ManifestError, match="unknown key 'max_replicaz'"):
        read_policy(path)


def services_up_starts(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[str]]:
    """What `specstream up` starts, by name: the command line after `specstream --config FILE`."""
    import argparse
    import shutil as shutil_mod

    from streams.commands import up
    from streams.commands import keys as keys_commands

    started: dict[str, list[str]] = {}

    class Recorder:
        def start(self, name: str, argv: list[str]) -> None:
            started[name] = argv[argv.index("--config") + 2:]

    monkeypatch.setattr(up, "_http_status", lambda url: None)
    monkeypatch.setattr(up, "_wait_ready", lambda base, supervisor: None)
    monkeypatch.setattr(up, "_print_urls", lambda *a, **k: None)
    monkeypatch.setattr(keys_commands, "prepare_up", lambda settings, say: None)
    monkeypatch.setattr(shutil_mod, "which", lambda name: f"/usr/bin/{name}")  # bubblewrap "installed"
    args = argparse.Namespace(config="specstream.yaml", no_edge=False, no_worker=False, no_parser=False,
                              no_tool_runner=False, no_rag=False)
    up._start_services(args, load_settings(None), Recorder())  # type: ignore[arg-type]
    return started


def containers(resources: list[dict[str, Any]]) -> dict[str, tuple[dict[str, Any], dict[str, Any]]]:
    """Each Deployment's name -> (its pod spec, its first container)."""
    return {d["metadata"]["name"]: (d["spec"]["template"]["spec"], d["spec"]["template"]["spec"]["containers"][0])
            for d in resources if d["kind"] == "Deployment"}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_service_up_starts_has_a_deployment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  overlay: str) -> None:
    started = services_up_starts(monkeypatch)
    assert set(started) >= {"worker", "edge", "parser", "rag", "tool-runner", "batch-assembler"}
    commands = {tuple(c["args"]) for _, c in containers(rendered(tmp_path, overlay)).values()}
    missing = {name for name, argv in started.items() if tuple(argv) not in commands}
    # dev leaves out the qdrant component, and with it the rag service (README: no file_search there).
    assert missing == ({"rag"} if overlay == "dev" else set())


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_consumers_serve_metrics_where_prometheus_is_told_and_are_probed_there(tmp_path: Path, overlay: str) -> None:
    resources = rendered(tmp_path, overlay)
    for name, (pod, container) in containers(resources).items():
        if name in ("specstream-edge", "specstream-redis"):
            continue
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["SPECSTREAM_TELEMETRY__METRICS__WORKER_HOST"] == "0.0.0.0", name
        port = env["SPECSTREAM_TELEMETRY__METRICS__WORKER_PORT"]
        deployment = find(resources, "Deployment", name)
        assert deployment["spec"]["template"]["metadata"]["annotations"]["prometheus.io/port"] == port, name
        assert {p["name"]: str(p["containerPort"]) for p in container["ports"]}["metrics"] == port, name
        if name != "specstream-worker":  # the worker has no probe: it is ready once it announces itself
            assert container["readinessProbe"]["httpGet"] == {"path": "/metrics", "port": "metrics"}, name


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_files_store_is_one_rwx_claim_mounted_at_files_dir_by_edge_parser_and_assembler(
        tmp_path: Path, overlay: str) -> None:
    resources = rendered(tmp_path, overlay)
    assert find(resources, "PersistentVolumeClaim", "specstream-files")["spec"]["accessModes"] == ["ReadWriteMany"]
    users = {}
    for name, (pod, container) in containers(resources).items():
        volumes = {v["name"] for v in pod.get("volumes", []) if v.get("persistentVolumeClaim", {}).get("claimName")
                   == "specstream-files"}
        if volumes:
            mount = next(m["mountPath"] for m in container["volumeMounts"] if m["name"] in volumes)
            env = {e["name"]: e.get("value") for e in container["env"]}
            assert env["SPECSTREAM_FILES__DIR"] == mount, name
            users[name] = mount
    assert set(users) == {"specstream-edge", "specstream-parser", "specstream-batch-assembler"}


def test_the_tool_runner_gets_user_namespaces_without_privileges(tmp_path: Path) -> None:
    pod, container = containers(rendered(tmp_path, "prod"))["specstream-tool-runner"]
    security = container["securityContext"]
    assert security.get("privileged") is not True and security["allowPrivilegeEscalation"] is False
    assert pod["hostUsers"] is False and security["procMount"] == "Unmasked"  # bubblewrap's fresh /proc
    assert security["capabilities"]["drop"] == ["ALL"]
    assert set(security["capabilities"]["add"]) <= {"SETUID", "SETGID", "KILL"}
    assert pod["shareProcessNamespace"] is True  # an init that reaps what bubblewrap leaves behind
    assert not any("valueFrom" in e and "secretKeyRef" in e["valueFrom"] for e in container["env"])


def test_prod_rag_uses_the_qdrant_server_of_its_component(tmp_path: Path) -> None:
    resources = rendered(tmp_path, "prod")
    _, rag = containers(resources)["specstream-rag"]
    env = {e["name"]: e for e in rag["env"]}
    service = find(resources, "Service", "specstream-qdrant")
    port = next(p["port"] for p in service["spec"]["ports"] if p["name"] == "http")
    assert env["SPECSTREAM_RAG__QDRANT_URL"]["value"] == f"http://specstream-qdrant:{port}"
    assert env["SPECSTREAM_RAG__QDRANT_API_KEY"]["valueFrom"]["secretKeyRef"] == {
        "name": "specstream-secrets", "key": "qdrant-api-key"}
    assert find(resources, "Deployment", "specstream-rag")["spec"]["replicas"] == 1
