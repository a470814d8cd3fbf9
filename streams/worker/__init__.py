"""The engine worker: consumes GenerateRequests from Kafka, runs the engine, streams replies.

* :mod:`streams.worker.service` - the FastStream app (:func:`create_app`, :func:`run_worker`, :class:`EngineWorker`)
* :mod:`streams.worker.engine_driver` - the engine's dedicated thread
* :mod:`streams.worker.intake` - raw message -> validated request or precise rejection
* :mod:`streams.worker.offsets` - which offsets may be committed
"""
from streams.worker.service import EngineWorker, create_app, load_engine, run_worker

__all__ = ["EngineWorker", "create_app", "load_engine", "run_worker"]
