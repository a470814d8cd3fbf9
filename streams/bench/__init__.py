"""`specstream bench`: a serving load benchmark for specstream.

Drives a running service through any of its doors (OpenAI HTTP/SSE, websocket,
the Kafka request topic) or the engine in this process, with closed-loop
(concurrency) or open-loop (Poisson/gamma arrivals) load, checks every stream
while measuring, and reports latency percentiles, throughput, goodput under an
SLO, speculation statistics and errors by kind.

Entry point: :func:`streams.commands.bench.main`.
"""
