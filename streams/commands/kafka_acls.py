"""``specstream kafka acls --print|--apply|--revoke``: each service's least privileges (:mod:`streams.kafka.acls`).

``--print`` writes them as ``kafka-acls.sh`` commands, to review or to run where
specstream is not installed; ``--apply`` creates them through the admin API with
the configured connection, which must be an admin (super) user; ``--revoke``
deletes them. The principals default to the users the secured local broker
creates (``User:specstream-edge``, ``User:specstream-worker``).
"""
from __future__ import annotations

import argparse
import asyncio
import sys

from aiokafka.errors import KafkaError

from streams.config import ConfigError, Settings, load_settings
from streams.kafka.acls import SERVICES, Grant, apply, kafka_acls_commands, revoke


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specstream kafka acls",
                                     description="Least-privilege ACLs of each specstream service.")
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--print", dest="action", action="store_const", const="print",
                        help="print the grants as kafka-acls.sh commands")
    action.add_argument("--apply", dest="action", action="store_const", const="apply",
                        help="create the ACLs (the configured Kafka user must be an admin)")
    action.add_argument("--revoke", dest="action", action="store_const", const="revoke", help="delete the ACLs")
    parser.add_argument("--service", action="append", choices=sorted(SERVICES),
                        help="only this service (repeatable; default: all)")
    parser.add_argument("--principal", action="append", default=[], metavar="SERVICE=PRINCIPAL",
                        help="e.g. worker=User:gpu-worker (default: User:specstream-<service>)")
    parser.add_argument("--edge-id", help="grant the edge only its own reply topic, <prefix>.replies.<ID> "
                        "(default: every reply topic, by prefix)")
    return parser


def _principals(pairs: list[str]) -> dict[str, str]:
    principals = {name: service.default_principal for name, service in SERVICES.items()}
    for pair in pairs:
        service, _, principal = pair.partition("=")
        if service not in SERVICES or not principal.startswith("User:"):
            raise ValueError(f"--principal {pair!r}: expected SERVICE=User:NAME with SERVICE one of {', '.join(SERVICES)}")
        principals[service] = principal
    return principals


def plan(settings: Settings, services: list[str], edge_id: str | None) -> list[tuple[str, list[Grant]]]:
    """(service, grants) for each service asked for."""
    catalog = settings.catalog
    group_id = settings.worker.resolved_group_id(settings.kafka.topic_prefix)
    return [(name, SERVICES[name].grants(catalog, group_id, edge_id)) for name in services]


def main(config: str | None, argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    try:
        settings = load_settings(config)
        principals = _principals(args.principal)
    except (ConfigError, ValueError) as error:
        print(f"acls: error: {error}", file=sys.stderr)
        return 2
    planned = plan(settings, args.service or sorted(SERVICES), args.edge_id)
    if args.action == "print":
        for service, grants in planned:
            print(f"# {service} ({principals[service]}): " + ", ".join(f"{g.operation} {g.resource}" for g in grants))
            print("\n".join(kafka_acls_commands(principals[service], grants, settings.kafka.bootstrap_servers)))
        return 0
    change = apply if args.action == "apply" else revoke
    try:
        for service, grants in planned:
            asyncio.run(change(settings.kafka, principals[service], grants))
            done = "granted" if args.action == "apply" else "revoked"
            print(f"acls: {done} {len(grants)} to {principals[service]} ({service})")
    except KafkaError as error:
        print(f"acls: error: {error.args[0] if error.args else error}", file=sys.stderr)
        return 1
    return 0
