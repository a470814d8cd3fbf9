"""The engine worker: consumes GenerateRequests from Kafka, runs the engine, streams replies.

It is a consumer on the foundation (:mod:`streams.service`), which does the
intake, dead letters, commits, back-pressure, drain and announcements.

* :mod:`streams.worker.service` - the engine-specific handler (:class:`EngineWorker`, :func:`create_app`,
  :func:`run_worker`)
* :mod:`streams.worker.engine_driver` - the engine's dedicated thread
* :mod:`streams.worker.intake` - a validated request -> an engine request (prompt rendering, sampling)
* :mod:`streams.worker.replies` - engine outputs -> TokenChunks and a Completion
* :mod:`streams.worker.completions_log` - the record of each finished request on the completions topic
"""
from streams.worker.service import EngineWorker, create_app, load_engine, run_worker

__all__ = ["EngineWorker", "create_app", "load_engine", "run_worker"]
