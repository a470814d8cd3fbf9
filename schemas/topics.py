"""The topic catalog: every topic specstream uses, what flows on it, and how it is keyed.

Code creates topics from this table and docs/topics.md's catalog is generated from
it (`specstream topics --markdown`), so the two cannot drift apart.
"""
from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel

from schemas.adapters import AdapterCommand
from schemas.batch import BatchState
from schemas.documents import DocumentChunks, DocumentState, FileObject, IngestJob
from schemas.events import (
    CancelRequest,
    CompletionRecord,
    DeadLetter,
    EdgeAnnouncement,
    EvalSample,
    GenerateRequest,
    RolloutState,
    ServiceAnnouncement,
)
from schemas.responses import StoredResponse
from schemas.retrieval import IndexCommand, RetrievalRequest, VectorStoreRecord
from schemas.tools import ToolIntent, ToolResult

HOUR_MS = 3_600_000
DEAD_LETTER_MAX_BYTES = 8 * 1024 * 1024


@dataclass(frozen=True)
class Topic:
    name: str
    partitions: int
    key: str
    retention_ms: int
    carries: str
    purpose: str
    compacted: bool = False
    # Topic-level max.message.bytes; None keeps the broker's default (about 1 MiB).
    max_message_bytes: int | None = None
    # Topic-level segment.ms; None keeps the broker's default (7 days). Retention only ever deletes whole closed
    # segments, so a short retention needs segments that roll about as often, or nothing expires for a week.
    segment_ms: int | None = None
    # A compacted topic that also deletes what is past its retention (cleanup.policy compact,delete): kept per key,
    # but not forever.
    expires: bool = False

    def config(self, min_insync_replicas: int | None = None) -> dict[str, str]:
        cfg = {"retention.ms": str(self.retention_ms)}
        if self.compacted:
            cfg["cleanup.policy"] = "compact,delete" if self.expires else "compact"
        if self.max_message_bytes is not None:
            cfg["max.message.bytes"] = str(self.max_message_bytes)
        if self.segment_ms is not None:
            cfg["segment.ms"] = str(self.segment_ms)
        if min_insync_replicas is not None:
            cfg["min.insync.replicas"] = str(min_insync_replicas)
        return cfg


def _describe(model: type[BaseModel]) -> str:
    return model.__name__


@dataclass(frozen=True)
class TopicCatalog:
    """Names are derived from one prefix so several deployments can share a cluster."""

    prefix: str = "specstream"
    request_partitions: int = 6
    completions_retention_ms: int = 7 * 24 * HOUR_MS
    tools_retention_ms: int = 7 * 24 * HOUR_MS
    responses_retention_ms: int = 30 * 24 * HOUR_MS

    @property
    def requests(self) -> Topic:
        return Topic(
            name=f"{self.prefix}.requests", partitions=self.request_partitions, key="conversation_id, else request_id",
            retention_ms=24 * HOUR_MS, carries=_describe(GenerateRequest),
            purpose="Generation requests; engine workers consume them as one consumer group.",
        )

    def replies(self, edge_id: str) -> Topic:
        return Topic(
            name=f"{self.prefix}.replies.{edge_id}", partitions=1, key="request_id",
            retention_ms=1 * HOUR_MS,
            carries="TokenChunk | Completion | ErrorEvent | SearchResults | Retrieved | IndexState",
            purpose="Replies for one edge (or client): each edge owns its reply topic, so it receives only its own "
            "replies; one partition keeps every request's events in order. Short retention bounds what a dead edge "
            "leaves; `specstream topics gc` deletes the topics of edges gone for longer.",
            segment_ms=1 * HOUR_MS,
        )

    @property
    def cancellations(self) -> Topic:
        return Topic(
            name=f"{self.prefix}.cancellations", partitions=1, key="request_id",
            retention_ms=1 * HOUR_MS, carries=_describe(CancelRequest),
            purpose="Cancellation of requests whose client went away; every worker reads all of it.",
            segment_ms=1 * HOUR_MS,
        )

    @property
    def services(self) -> Topic:
        return Topic(
            name=f"{self.prefix}.services", partitions=1, key="<kind>/<service_id>",
            retention_ms=24 * HOUR_MS, carries=_describe(ServiceAnnouncement), compacted=True,
            purpose="Every service (engine workers, edges, consumers) announces starting/ready/draining/stopped with "
            "its kind, id, host, pid and requests in flight; /readyz, `specstream status` and the autoscaler read it.",
        )

    @property
    def edges(self) -> Topic:
        return Topic(
            name=f"{self.prefix}.edges", partitions=1, key="edge_id",
            retention_ms=24 * HOUR_MS, carries=_describe(EdgeAnnouncement), compacted=True,
            purpose="Edges announce themselves every minute; `specstream topics gc` deletes reply topics of edges "
            "not seen for a while.",
        )

    @property
    def dead_letters(self) -> Topic:
        return Topic(
            name=f"{self.prefix}.dead-letters", partitions=1, key="source offset",
            retention_ms=7 * 24 * HOUR_MS, carries=_describe(DeadLetter),
            purpose="Messages a consumer could not process, with reason, original bytes and source offset.",
            # Room for the base64 copy (4/3 of the size) of a request that was itself at the broker's size limit.
            max_message_bytes=DEAD_LETTER_MAX_BYTES,
        )

    @property
    def completions(self) -> Topic:
        return Topic(
            name=f"{self.prefix}.completions", partitions=1, key="request_id",
            retention_ms=self.completions_retention_ms, carries=_describe(CompletionRecord),
            purpose="Every finished request once (request as received unless its tenant keeps prompts out, answer, "
            "timings, speculation stats, worker, config fingerprint); `specstream eval replay` and draft training "
            "read it. Retention: eval.completions_retention_h.",
            # A record holds the request and its answer: room for a request at the worker's size limit.
            max_message_bytes=DEAD_LETTER_MAX_BYTES,
        )

    @property
    def eval_samples(self) -> Topic:
        return Topic(
            name=f"{self.prefix}.eval-samples", partitions=1, key="sample_id",
            retention_ms=7 * 24 * HOUR_MS, carries=_describe(EvalSample),
            purpose="Evaluation items (input, optional reference answer, tags) that `specstream eval run` published "
            "and scored; `eval replay` reads references from it.",
        )

    @property
    def rollouts(self) -> Topic:
        return Topic(
            name=f"{self.prefix}.rollouts", partitions=1, key="model",
            retention_ms=7 * 24 * HOUR_MS, carries=_describe(RolloutState), compacted=True,
            purpose="Canary rollouts: each model's newest state (share of requests to the candidate pool, step, "
            "outcome and why); every edge follows it, so a restarted or second edge routes alike.",
        )

    @property
    def adapters(self) -> Topic:
        return Topic(
            name=f"{self.prefix}.adapters", partitions=1, key="lora_name",
            retention_ms=7 * 24 * HOUR_MS, carries=_describe(AdapterCommand), compacted=True,
            purpose="LoRA adapters: each adapter's newest load or unload; every engine worker reads it from the "
            "beginning, so one started later serves the same adapters.",
        )

    @property
    def files(self) -> Topic:
        return Topic(
            name=f"{self.prefix}.files", partitions=1, key="file id",
            retention_ms=7 * 24 * HOUR_MS, carries=_describe(FileObject), compacted=True,
            purpose="Uploaded files (`/v1/files`): each file's metadata and blob reference (its bytes stay in the "
            "blob store, `files.dir`); a tombstone deletes it. Every edge reads it whole, so a restarted or second "
            "edge sees the same files.",
        )

    @property
    def ingest_jobs(self) -> Topic:
        return Topic(
            name=f"{self.prefix}.ingest-jobs", partitions=3, key="<vector_store_id>/<file_id>",
            retention_ms=7 * 24 * HOUR_MS, carries=_describe(IngestJob),
            purpose="Files to parse into a vector store's index (blob reference, checksum, chunking, index "
            "version); document parsers consume them as one consumer group.",
        )

    @property
    def document_chunks(self) -> Topic:
        return Topic(
            name=f"{self.prefix}.document-chunks", partitions=3, key="<vector_store_id>/<file_id>",
            retention_ms=7 * 24 * HOUR_MS, carries=_describe(DocumentChunks),
            purpose="A parsed document's chunks (text, character span, page, tokens), in size-bounded parts with the "
            "total chunk count; the indexer embeds them. A redelivered job republishes identical chunks.",
        )

    @property
    def documents(self) -> Topic:
        return Topic(
            name=f"{self.prefix}.documents", partitions=1, key="<vector_store_id>/<file_id>",
            retention_ms=7 * 24 * HOUR_MS, carries=_describe(DocumentState), compacted=True,
            purpose="Each document's current state in a vector store (in_progress, completed, failed with "
            "last_error) and the job that makes it; what an index rebuild replays. A tombstone removes it.",
        )

    @property
    def batch_lines(self) -> Topic:
        return Topic(
            name=f"{self.prefix}.batch-lines", partitions=self.request_partitions, key="<batch id>.<line>",
            retention_ms=48 * HOUR_MS, carries=_describe(GenerateRequest),
            purpose="The lines of offline batch jobs, one request each at the lowest priority. Apart from the "
            "request topic so a batch's backlog waits here, never ahead of interactive requests; engine workers "
            "read it as their own group, holding at most batch.worker_slots lines each. Retention: twice the "
            "completion window.",
        )

    @property
    def batch_results(self) -> Topic:
        return Topic(
            name=f"{self.prefix}.batch-results", partitions=self.request_partitions, key="<batch id>.<line>",
            retention_ms=48 * HOUR_MS, carries="Completion | ErrorEvent",
            purpose="The answers to batch lines (the lines' reply route); the batch assembler writes them into "
            "the output and error files, each custom_id once.",
        )

    @property
    def batches(self) -> Topic:
        return Topic(
            name=f"{self.prefix}.batches", partitions=1, key="batch_id",
            retention_ms=30 * 24 * HOUR_MS, carries=_describe(BatchState), compacted=True,
            purpose="Each batch's newest state (status, request counts, output files); every edge, the "
            "assembler and the workers follow it, so a restarted one knows every batch.",
        )

    @property
    def tool_intents(self) -> Topic:
        return Topic(
            name=f"{self.prefix}.tool-intents", partitions=3, key="call_id",
            retention_ms=self.tools_retention_ms, carries=_describe(ToolIntent),
            purpose="Server-side tool calls (request, call id, tool, validated arguments, tenant, deadline) that "
            "workers and `specstream tools call` publish; tool runners execute them as one consumer group. Kept as "
            "the audit log (retention: tools.retention_h).",
        )

    @property
    def tool_results(self) -> Topic:
        return Topic(
            name=f"{self.prefix}.tool-results", partitions=1, key="call_id",
            retention_ms=self.tools_retention_ms, carries=_describe(ToolResult),
            purpose="The outcome of each tool call (output or error, duration, truncated flag); every worker reads "
            "all of it and takes the first result of each call it waits for. Kept as the audit log.",
        )

    @property
    def vector_stores(self) -> Topic:
        return Topic(
            name=f"{self.prefix}.vector-stores", partitions=1, key="vector_store_id",
            retention_ms=7 * 24 * HOUR_MS, carries=_describe(VectorStoreRecord), compacted=True,
            purpose="Vector stores (`/v1/vector_stores`): each store's record (name, tenant, chunking, the index "
            "version answering queries); a tombstone deletes it. Every edge and the rag service read it whole.",
        )

    @property
    def retrieval(self) -> Topic:
        return Topic(
            name=f"{self.prefix}.retrieval", partitions=3, key="request_id",
            retention_ms=1 * HOUR_MS, carries=_describe(RetrievalRequest),
            purpose="Users' searches and chat requests with the file_search tool, each for a tenant (the retriever "
            "refuses another tenant's store); the rag service (the one process that opens the index) answers on the "
            "caller's reply topic and sends grounded chat requests on to the request topic.",
            segment_ms=1 * HOUR_MS,
        )

    @property
    def index_commands(self) -> Topic:
        return Topic(
            name=f"{self.prefix}.index-commands", partitions=1, key="request_id",
            retention_ms=1 * HOUR_MS, carries=_describe(IndexCommand),
            purpose="Index administration (a rebuild's prepare, count, canary search and swap of a store's index "
            "versions) that `specstream index rebuild` publishes; the rag service answers on the caller's reply "
            "topic. Apart from users' searches so only operators may write it.",
            segment_ms=1 * HOUR_MS,
        )

    @property
    def responses(self) -> Topic:
        return Topic(
            name=f"{self.prefix}.responses", partitions=1, key="tenant/response id",
            retention_ms=self.responses_retention_ms, carries=_describe(StoredResponse), compacted=True, expires=True,
            purpose="Stored responses of the Responses API (`/v1/responses`, `store: true`): each response and the "
            "conversation it continued, for GET and `previous_response_id`; a tombstone deletes one. Every edge reads "
            "it whole, so any replica answers. Retention: edge.responses_retention_h.",
            segment_ms=1 * HOUR_MS,
        )

    def shared_topics(self) -> list[Topic]:
        """Topics created once per deployment (reply topics are created by each edge)."""
        return [self.requests, self.cancellations, self.services, self.edges, self.dead_letters, self.rollouts,
                self.completions, self.eval_samples, self.adapters, self.files, self.ingest_jobs,
                self.document_chunks, self.documents, self.vector_stores, self.retrieval, self.index_commands,
                self.batch_lines, self.batch_results, self.batches, self.tool_intents, self.tool_results,
                self.responses]

    def markdown(self) -> str:
        rows = [*self.shared_topics(), self.replies("<edge-id>")]
        lines = [
            "| topic | partitions | key | retention | carries | purpose |",
            "|---|---|---|---|---|---|",
        ]
        for t in rows:
            retention = f"{t.retention_ms / HOUR_MS:g} h" + (", compacted" if t.compacted else "")
            lines.append(f"| `{t.name}` | {t.partitions} | {t.key} | {retention} | `{t.carries}` | {t.purpose} |")
        return "\n".join(lines)
