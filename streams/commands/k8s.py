"""``specstream k8s generate|build|validate OVERLAY``: the Kubernetes manifests of infra/k8s.

    specstream --config infra/k8s/overlays/prod/specstream.yaml k8s generate infra/k8s/overlays/prod
    specstream --config infra/k8s/overlays/prod/specstream.yaml k8s build infra/k8s/overlays/prod > prod.yaml
    specstream --config infra/k8s/overlays/prod/specstream.yaml k8s validate infra/k8s/overlays/prod

``generate`` writes the overlay's KafkaTopics and ScaledObject (:mod:`streams.ops.manifests`); ``build`` generates,
then renders the overlay with the real kustomize (:mod:`streams.ops.kustomize`) as one YAML stream; ``validate``
renders and checks every resource offline (:mod:`streams.ops.manifest_checks`), exit status 1 when one is invalid.
"""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from streams.commands.common import say
from streams.config import Settings

EXIT_BAD_INPUT = 2


def add_commands(commands: Any) -> None:
    p = commands.add_parser("k8s", help="Kubernetes manifests: generate, build or validate an overlay of infra/k8s")
    p.add_argument("action", choices=["generate", "build", "validate"])
    p.add_argument("overlay", type=Path, help="an overlay folder, e.g. infra/k8s/overlays/prod")
    p.set_defaults(handler=cmd_k8s)


def cmd_k8s(args: argparse.Namespace, settings: Settings) -> int:
    import yaml

    from streams.ops.kustomize import KustomizeError, build
    from streams.ops.manifests import ManifestError, generate

    if args.config is None:
        say(f"k8s: pass the overlay's configuration: specstream --config {args.overlay / 'specstream.yaml'} k8s ...")
        return EXIT_BAD_INPUT
    try:
        written = generate(args.overlay, settings)
        if args.action == "generate":
            for path in written:
                say(f"wrote {path}")
            return 0
        resources = build(args.overlay)
    except (ManifestError, KustomizeError, OSError) as error:
        say(f"k8s: {error}")
        return EXIT_BAD_INPUT
    if args.action == "build":
        print(yaml.safe_dump_all(resources, sort_keys=False), end="")
        return 0
    return _validate(resources, settings)


def _validate(resources: list[dict[str, Any]], settings: Settings) -> int:
    from streams.ops.manifest_checks import check, policy_problems

    results = [check(r) for r in resources]
    for result in results:
        print(f"{result.outcome:8} {result.kind}/{result.name}: {result.detail}")
    problems = policy_problems(resources, settings.worker.drain_timeout_s)
    for problem in problems:
        print(f"invalid  {problem}")
    invalid = sum(r.outcome == "invalid" for r in results) + len(problems)
    skipped = sum(r.outcome == "skipped" for r in results)
    say(f"{len(results)} resource(s): {len(results) - invalid - skipped} valid, {skipped} skipped, {invalid} invalid")
    return 1 if invalid else 0
