"""Offline checks of rendered manifests: Kubernetes' own kinds against its published schemas, custom resources
against their CRDs' schemas where we carry them, and what no schema says (probes, drains, secrets, the scaler).

* Built-in kinds: ``kubernetes-validate`` (PyPI; bundles the OpenAPI schemas of every Kubernetes release) in strict
  mode, so an unknown field is an error, not a silently ignored key.
* ``KafkaTopic`` and ``ScaledObject``: the ``spec`` schemas of Strimzi's CRD (``kafka.strimzi.io/v1beta2``,
  043-Crd-kafkatopic.yaml) and KEDA's (``keda.sh/v1alpha1``, config/crd/bases/keda.sh_scaledobjects.yaml; the
  fields used here), transcribed below. Unknown fields are errors here: the API server would prune them silently.
* ``Kafka`` and ``KafkaNodePool`` (Strimzi): skipped, with that reason in the result. Their CRD schemas are thousands
  of lines that are not published as a package.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jsonschema

KUBERNETES_VERSION = "1.30.0"
SKIPPED_KINDS = {
    "Kafka": "Strimzi's CRD schema is not bundled offline (the Kafka CRD alone is thousands of lines)",
    "KafkaNodePool": "Strimzi's CRD schema is not bundled offline",
}
# Strimzi 0.4x, kafka.strimzi.io/v1beta2 KafkaTopic: spec (from the CRD's openAPIV3Schema).
KAFKA_TOPIC_SPEC = {
    "type": "object",
    "properties": {
        "partitions": {"type": "integer", "minimum": 1},
        "replicas": {"type": "integer", "minimum": 1, "maximum": 32767},
        "config": {"type": "object"},
        "topicName": {"type": "string"},
    },
    "additionalProperties": False,
}
_INT32 = {"type": "integer", "minimum": 0, "maximum": 2**31 - 1}
_WINDOW = {"type": "object", "properties": {"stabilizationWindowSeconds": {"type": "integer", "minimum": 0,
                                                                         "maximum": 3600},
                                            "selectPolicy": {"type": "string"}, "policies": {"type": "array"}},
           "additionalProperties": False}
# KEDA 2.x, keda.sh/v1alpha1 ScaledObject: spec (the CRD's openAPIV3Schema, for the fields this project renders).
SCALED_OBJECT_SPEC = {
    "type": "object",
    "required": ["scaleTargetRef", "triggers"],
    "properties": {
        "scaleTargetRef": {"type": "object", "required": ["name"], "additionalProperties": False,
                           "properties": {"name": {"type": "string"}, "kind": {"type": "string"},
                                          "apiVersion": {"type": "string"}, "envSourceContainerName": {"type": "string"}}},
        "pollingInterval": _INT32, "cooldownPeriod": _INT32, "minReplicaCount": _INT32, "maxReplicaCount": _INT32,
        "idleReplicaCount": _INT32,
        "advanced": {"type": "object", "additionalProperties": False, "properties": {
            "restoreToOriginalReplicaCount": {"type": "boolean"},
            "horizontalPodAutoscalerConfig": {"type": "object", "additionalProperties": False, "properties": {
                "name": {"type": "string"},
                "behavior": {"type": "object", "additionalProperties": False,
                             "properties": {"scaleUp": _WINDOW, "scaleDown": _WINDOW}}}}}},
        "triggers": {"type": "array", "minItems": 1, "items": {
            "type": "object", "required": ["type", "metadata"], "additionalProperties": False,
            "properties": {"type": {"type": "string"}, "name": {"type": "string"},
                           "metadata": {"type": "object", "additionalProperties": {"type": "string"}},
                           "authenticationRef": {"type": "object", "required": ["name"]}}}},
    },
    "additionalProperties": False,
}
CRD_SPECS = {"KafkaTopic": ("Strimzi KafkaTopic CRD schema", KAFKA_TOPIC_SPEC),
             "ScaledObject": ("KEDA ScaledObject CRD schema", SCALED_OBJECT_SPEC)}


@dataclass(frozen=True)
class Check:
    kind: str
    name: str
    outcome: str  # "valid", "invalid" or "skipped"
    detail: str = ""


def check(resource: dict[str, Any], kubernetes_version: str = KUBERNETES_VERSION) -> Check:
    import kubernetes_validate

    kind, name = resource.get("kind", "?"), resource.get("metadata", {}).get("name", "?")
    if kind in SKIPPED_KINDS:
        return Check(kind, name, "skipped", SKIPPED_KINDS[kind])
    if kind in CRD_SPECS:
        source, schema = CRD_SPECS[kind]
        try:
            jsonschema.validate(resource.get("spec"), schema)
        except jsonschema.ValidationError as error:
            where = ".".join(str(p) for p in error.path) or "(top)"
            return Check(kind, name, "invalid", f"spec.{where}: {error.message}")
        return Check(kind, name, "valid", source)
    try:
        kubernetes_validate.validate(resource, kubernetes_version, strict=True)
    except kubernetes_validate.ValidationError as error:
        where = ".".join(str(p) for p in error.path) or "(top)"
        return Check(kind, name, "invalid", f"{where}: {error.message}")
    except kubernetes_validate.SchemaNotFoundError:
        return Check(kind, name, "invalid", f"no schema for {resource.get('apiVersion')}/{kind}")
    return Check(kind, name, "valid", f"Kubernetes {kubernetes_version} schema, strict")


def policy_problems(resources: list[dict[str, Any]], drain_timeout_s: float = 30.0) -> list[str]:
    """What the schemas do not say but the deployment needs; empty when all holds."""
    problems: list[str] = []
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for r in resources:
        by_kind.setdefault(r["kind"], []).append(r)
    for deployment in by_kind.get("Deployment", []):
        problems += _pod_problems(deployment, drain_timeout_s)
    for scaler in by_kind.get("ScaledObject", []):
        trigger = scaler["spec"]["triggers"][0]["metadata"]
        if not trigger.get("topic"):
            problems.append(f"ScaledObject/{scaler['metadata']['name']}: no topic (KEDA would sum every topic)")
        targets = {d["metadata"]["name"] for d in by_kind.get("Deployment", [])}
        if scaler["spec"]["scaleTargetRef"]["name"] not in targets:
            problems.append(f"ScaledObject/{scaler['metadata']['name']}: scales a Deployment that is not there")
    return problems


def _pod_problems(deployment: dict[str, Any], drain_timeout_s: float) -> list[str]:
    name = f"Deployment/{deployment['metadata']['name']}"
    pod = deployment["spec"]["template"]["spec"]
    problems = []
    for container in pod["containers"]:
        for env in container.get("env", []):
            secret_like = any(w in env["name"].lower() for w in ("key", "password", "token", "secret"))
            if secret_like and "value" in env:
                problems.append(f"{name}: {env['name']} is written in the manifest; take it from a Secret")
        if "edge" in container.get("args", []):
            probes = (container.get("readinessProbe", {}).get("httpGet", {}).get("path"),
                      container.get("livenessProbe", {}).get("httpGet", {}).get("path"))
            if probes != ("/readyz", "/healthz"):
                problems.append(f"{name}: edge probes are {probes}, want readiness /readyz and liveness /healthz")
        if "worker" in container.get("args", []):
            if "preStop" not in container.get("lifecycle", {}):
                problems.append(f"{name}: the worker has no preStop drain")
            if pod.get("terminationGracePeriodSeconds", 30) <= drain_timeout_s:
                problems.append(f"{name}: the grace period does not outlast the worker's {drain_timeout_s:g} s drain")
    return problems
