"""Local Apache Kafka (KRaft) for development and tests, without Docker.

Public API lives in :mod:`infra.kafka.broker`; ``python -m infra.kafka`` is the CLI.
This package stays import-light on purpose: nothing here imports aiokafka or
starts Java until a function is called.
"""
