"""``specstream autoscale``: engine workers on this machine follow the backlog in Kafka; or the same as KEDA.

    specstream autoscale --min 1 --max 4                 start/drain local `specstream worker` processes
    specstream autoscale --min 0 --max 8 --render-keda   print the KEDA ScaledObject of the same policy

The decision is :mod:`streams.ops.scaling` (KEDA's Kafka-scaler arithmetic with HPA-style windows), the load
:mod:`streams.ops.lag`, the loop :mod:`streams.ops.control`, the workers :mod:`streams.ops.local_fleet`. Ctrl-C
or SIGTERM drains every worker it started and exits.
"""
from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from pathlib import Path
from typing import Any

from streams.commands.common import say
from streams.config import Settings
from streams.ops.scaling import ScalePolicy

EXIT_BAD_INPUT = 2


def add_commands(commands: Any) -> None:
    p = commands.add_parser("autoscale", help="start and drain local workers by consumer lag (or --render-keda)")
    p.add_argument("--min", type=int, default=1, dest="min_replicas", help="fewest workers; 0 allows scale to zero")
    p.add_argument("--max", type=int, default=4, dest="max_replicas", help="most workers")
    p.add_argument("--lag-threshold", type=int, default=16,
                   help="target requests (waiting or held) per worker: replicas = ceil(load / this)")
    p.add_argument("--activation-lag-threshold", type=int, default=0,
                   help="load at or below this counts as idle (scale to --min)")
    p.add_argument("--allow-idle-consumers", action="store_true",
                   help="allow more workers than request partitions (the extra ones sit idle)")
    p.add_argument("--scale-up-window", type=float, default=0.0, metavar="S",
                   help="scale up to the lowest recommendation of the last S seconds (0: at once)")
    p.add_argument("--scale-down-window", type=float, default=60.0, metavar="S",
                   help="scale down to the highest recommendation of the last S seconds")
    p.add_argument("--interval", type=float, default=2.0, metavar="S", help="seconds between observations")
    p.add_argument("--log-dir", type=Path, help="each worker's output in DIR/<worker-id>.log (default: this terminal)")
    keda = p.add_argument_group("KEDA")
    keda.add_argument("--render-keda", action="store_true", help="print the KEDA ScaledObject (YAML) and exit")
    keda.add_argument("--deployment", default="specstream-worker", help="the workers' Deployment (scaleTargetRef)")
    keda.add_argument("--namespace", help="metadata.namespace of the ScaledObject")
    keda.add_argument("--polling-interval", type=int, default=15, help="KEDA's pollingInterval in seconds")
    p.set_defaults(handler=cmd_autoscale)


def policy_from(args: argparse.Namespace) -> ScalePolicy:
    return ScalePolicy(min_replicas=args.min_replicas, max_replicas=args.max_replicas,
                       lag_threshold=args.lag_threshold, activation_lag_threshold=args.activation_lag_threshold,
                       allow_idle_consumers=args.allow_idle_consumers, scale_up_window_s=args.scale_up_window,
                       scale_down_window_s=args.scale_down_window)


def cmd_autoscale(args: argparse.Namespace, settings: Settings) -> int:
    try:
        policy = policy_from(args)
        if args.interval <= 0:
            raise ValueError(f"--interval must be positive, got {args.interval:g}")
    except ValueError as error:
        say(f"autoscale: {error}")
        return EXIT_BAD_INPUT
    if args.render_keda:
        print(render_keda(policy, settings, deployment=args.deployment, namespace=args.namespace,
                          polling_interval_s=args.polling_interval), end="")
        return 0
    from aiokafka.errors import KafkaError

    from streams.commands.common import describe
    from streams.commands.topics import create_topics

    try:
        create_topics(settings)  # the request topic's partitions cap the workers; a first worker needs the topics
    except (KafkaError, OSError) as error:
        say(f"autoscale: error: {describe(error)}")
        return 1
    return asyncio.run(_run(args, settings, policy))


def render_keda(policy: ScalePolicy, settings: Settings, *, deployment: str, namespace: str | None,
                polling_interval_s: int) -> str:
    import yaml

    from streams.ops.scaling import scaled_object

    obj = scaled_object(policy, name=deployment, deployment=deployment,
                        bootstrap_servers=settings.kafka.bootstrap_servers,
                        consumer_group=settings.worker.resolved_group_id(settings.kafka.topic_prefix),
                        topic=settings.catalog.requests.name, namespace=namespace,
                        polling_interval_s=polling_interval_s)
    return yaml.safe_dump(obj, sort_keys=False)


async def _run(args: argparse.Namespace, settings: Settings, policy: ScalePolicy) -> int:
    from streams.ops.control import ControlLoop, Controller
    from streams.ops.lag import LoadProbe
    from streams.ops.local_fleet import LocalFleet
    from streams.ops.scaling import Autoscaler
    from streams.supervisor import STOP_TIMEOUT_S, service_argv

    catalog = settings.catalog
    probe = LoadProbe(settings.kafka, settings.worker.resolved_group_id(settings.kafka.topic_prefix),
                      catalog.requests.name, catalog.services.name,
                      stale_after_s=settings.edge.ready_heartbeats * settings.worker.heartbeat_s)
    config = args.config if isinstance(getattr(args, "config", None), str) else None
    fleet = LocalFleet(service_argv(config, "worker"), say, log_dir=args.log_dir)
    loop = ControlLoop(probe, fleet, Controller(Autoscaler(policy)), say, interval_s=args.interval)
    for sig in (signal.SIGINT, signal.SIGTERM):
        asyncio.get_running_loop().add_signal_handler(sig, loop.stop.set)
    say(f"autoscale: {policy.min_replicas}..{policy.max_replicas} worker(s), {policy.lag_threshold} request(s) "
        f"per worker, group {probe.group_id} on {probe.topic}; scale-down window {policy.scale_down_window_s:g} s")
    try:
        await loop.run()
    finally:
        say(f"autoscale: stopping; draining {fleet.size} worker(s)")
        await asyncio.to_thread(fleet.stop_all, STOP_TIMEOUT_S)
    sys.stderr.flush()
    return 0
