"""The real stack for tests and benchmarks (the integration tests and ``bench/soak.py`` share it).

* :mod:`.stack`: an engine worker and an edge as ``python -m streams.cli`` subprocesses
  on a topic prefix of their own, ready once the edge's ``/readyz`` says so.
* :mod:`.reliability`: what the fault-injection tests and the soak measure with:
  websocket clients that keep every frame they received, worker fleets to kill
  and add, Kafka probes (committed offsets, reply-topic records).

Nothing here is a fake: these start and observe the real processes on a real broker.
"""
