"""Completion records as a worker writes them to ``<prefix>.completions``, for tests of what reads that topic
(draft training, suffix decoding's feed), and publishing them to a fresh topic on the real broker."""
from __future__ import annotations

from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from schemas.events import (
    ChatMessage,
    Completion,
    CompletionRecord,
    GenerateRequest,
    ReplyRoute,
    SamplingParams,
    Timings,
    Usage,
)
from streams.kafka import clients
from streams.worker.completions_log import completion_record


def record(rid: str, question: str, answer: str, *, model: str = "m", tenant: str = "t", log_prompt: bool = True,
           worker: str = "w") -> CompletionRecord:
    """The record of a chat request answered with `answer` by `worker`."""
    request = GenerateRequest(request_id=rid, messages=[ChatMessage(role="user", content=question)], model=model,
                              tenant=tenant, log_prompt=log_prompt, sampling=SamplingParams(max_tokens=32),
                              reply_to=ReplyRoute(topic="replies"))
    final = Completion(request_id=rid, text=answer, finish_reason="stop", num_chunks=1,
                       usage=Usage(prompt_tokens=10, completion_tokens=10, total_tokens=20),
                       timings=Timings(queued_s=0.0, ttft_s=0.1, total_s=0.2))
    return completion_record(request, final, worker_id=worker, fingerprint="f", served_model=model)


async def publish(bootstrap: str, topic: str, records: list[CompletionRecord]) -> None:
    """Create `topic` (one partition) and publish the records to it, keyed by request id."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])
    finally:
        await admin.close()
    producer = clients.make_producer(bootstrap, client_id="pytest-completions")
    await producer.start()
    try:
        for rec in records:
            await producer.send(topic, clients.encode(rec), key=rec.request_id.encode())
        await producer.flush()
    finally:
        await producer.stop()
