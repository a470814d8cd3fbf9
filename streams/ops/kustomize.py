"""Render a kustomization in Python: the small subset of kustomize that ``infra/k8s`` uses, and nothing more.

kustomize itself is not on Debian bookworm (kubectl 1.20 there embeds kustomize v2, too old for ``components`` and
``labels``), so the tests and ``specstream k8s build`` render the overlays with this. Supported, as kustomize
documents them:

* ``resources`` (files, or folders with a kustomization) and ``components`` (folders with a ``Component``);
* ``namespace`` (set on every namespaced resource);
* ``configMapGenerator`` with ``files`` and ``literals``, only under ``generatorOptions.disableNameSuffixHash``
  (no hash suffixes, so no name references need rewriting);
* ``patches`` with ``path`` to a strategic-merge patch naming its target by kind and metadata.name; lists of
  objects with a ``name`` (containers, env, volumes, ports) merge by name, other lists are replaced;
* ``images`` (``newName``, ``newTag``) and ``replicas``.

Any other key is refused with its name, so a kustomization this cannot render faithfully never renders silently
wrong. ``kubectl apply -k`` with a real kustomize renders the same overlays (docs: infra/k8s/README.md).
"""
from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

SUPPORTED = {"apiVersion", "kind", "namespace", "resources", "components", "configMapGenerator", "generatorOptions",
             "patches", "images", "replicas"}
CLUSTER_SCOPED = {"Namespace", "CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding", "PersistentVolume",
                  "StorageClass", "PriorityClass"}
Resource = dict[str, Any]


class KustomizeError(ValueError):
    """A kustomization outside the supported subset, or one that refers to something missing."""


def build(folder: Path) -> list[Resource]:
    kustomization = _load_kustomization(folder)
    resources: list[Resource] = []
    for entry in kustomization.get("resources", []):
        resources += _resource_entry(folder / entry)
    resources += _config_maps(folder, kustomization)
    for entry in kustomization.get("components", []):
        component = folder / entry
        if _load_kustomization(component).get("kind") != "Component":
            raise KustomizeError(f"{component}: listed under components but is not a Component")
        resources = _apply(component, _load_kustomization(component), resources + _resources_of(component))
    return _apply(folder, kustomization, resources)


def _resources_of(component: Path) -> list[Resource]:
    out: list[Resource] = []
    for entry in _load_kustomization(component).get("resources", []):
        out += _resource_entry(component / entry)
    return out


def _load_kustomization(folder: Path) -> dict[str, Any]:
    path = folder / "kustomization.yaml"
    if not path.is_file():
        raise KustomizeError(f"{folder}: no kustomization.yaml")
    data = yaml.safe_load(path.read_text()) or {}
    unknown = sorted(set(data) - SUPPORTED)
    if unknown:
        raise KustomizeError(f"{path}: {unknown[0]!r} is outside the kustomize subset this renders")
    options = data.get("generatorOptions", {})
    if data.get("configMapGenerator") and options != {"disableNameSuffixHash": True}:
        raise KustomizeError(f"{path}: configMapGenerator needs generatorOptions.disableNameSuffixHash: true here")
    return data


def _resource_entry(path: Path) -> list[Resource]:
    if path.is_dir():
        return build(path)
    if not path.is_file():
        raise KustomizeError(f"{path}: no such resource file (generated? `specstream k8s generate`)")
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def _config_maps(folder: Path, kustomization: dict[str, Any]) -> list[Resource]:
    maps = []
    for generator in kustomization.get("configMapGenerator", []):
        data = {Path(f).name: (folder / f).read_text() for f in generator.get("files", [])}
        for literal in generator.get("literals", []):
            key, _, value = literal.partition("=")
            data[key] = value
        maps.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": generator["name"]}, "data": data})
    return maps


def _apply(folder: Path, kustomization: dict[str, Any], resources: list[Resource]) -> list[Resource]:
    resources = copy.deepcopy(resources)
    for patch in kustomization.get("patches", []):
        if set(patch) != {"path"}:
            raise KustomizeError(f"{folder}: only patches with a path are supported, got {sorted(patch)}")
        for doc in yaml.safe_load_all((folder / patch["path"]).read_text()):
            target = _find(resources, doc["kind"], doc["metadata"]["name"], folder / patch["path"])
            merged = merge(target, doc)
            target.clear()
            target.update(merged)
    for image in kustomization.get("images", []):
        for container in _containers(resources):
            name, _, tag = container.get("image", "").partition(":")
            if name == image["name"]:
                container["image"] = f"{image.get('newName', name)}:{image.get('newTag', tag or 'latest')}"
    for replicas in kustomization.get("replicas", []):
        _find(resources, None, replicas["name"], folder)["spec"]["replicas"] = replicas["count"]
    if "namespace" in kustomization:
        for resource in resources:
            if resource["kind"] not in CLUSTER_SCOPED:
                resource["metadata"]["namespace"] = kustomization["namespace"]
    return resources


def _find(resources: list[Resource], kind: str | None, name: str, where: Path) -> Resource:
    for resource in resources:
        if resource["metadata"]["name"] == name and kind in (None, resource["kind"]):
            return resource
    raise KustomizeError(f"{where}: no {kind or 'resource'} named {name!r} to change")


def _containers(resources: list[Resource]) -> list[dict[str, Any]]:
    out = []
    for resource in resources:
        pod = resource.get("spec", {}).get("template", {}).get("spec", {})
        out += pod.get("containers", []) + pod.get("initContainers", [])
    return out


def merge(base: Any, patch: Any) -> Any:
    """Strategic merge as kustomize does it for the lists used here: objects with a ``name`` merge by name."""
    if isinstance(base, dict) and isinstance(patch, dict):
        out = dict(base)
        for key, value in patch.items():
            out[key] = merge(base[key], value) if key in base else copy.deepcopy(value)
        return out
    if isinstance(base, list) and isinstance(patch, list) and _named(base) and _named(patch):
        out = list(base)
        for item in patch:
            index = next((i for i, b in enumerate(out) if b["name"] == item["name"]), None)
            if index is None:
                out.append(copy.deepcopy(item))
            else:
                out[index] = merge(out[index], item)
        return out
    return copy.deepcopy(patch)


def _named(items: list[Any]) -> bool:
    return bool(items) and all(isinstance(i, dict) and "name" in i for i in items)
