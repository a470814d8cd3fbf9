"""The consumer foundation: what every well-behaved consumer on the bus needs, written once.

* :mod:`streams.service.consumer` - a consumer's description (input model, handler, outputs) and its options
* :mod:`streams.service.runner` - :class:`ConsumerService`: runs one consumer on Kafka (FastStream)
* :mod:`streams.service.app` - as a process: SIGTERM drain, exit 0, the watchdog
* :mod:`streams.service.delivery` - one message on its way to an answer (what a handler holds)
* :mod:`streams.service.intake` - raw bytes -> validated input, or a precise rejection
* :mod:`streams.service.offsets` / :mod:`streams.service.commits` - at-least-once commits
* :mod:`streams.service.publisher` - ordered publish lanes
* :mod:`streams.service.dead_letters` - what could not be processed, kept with its reason
* :mod:`streams.service.flow` - back-pressure and partition ownership
* :mod:`streams.service.announcer` - ready/draining/stopped on the services topic
* :mod:`streams.service.telemetry` - the hooks observability plugs into
"""
from streams.service.consumer import Consumer, Listener, Output, ServiceOptions
from streams.service.delivery import Delivery
from streams.service.intake import Rejection

__all__ = ["Consumer", "Delivery", "Listener", "Output", "Rejection", "ServiceOptions"]
