"""Least privileges of each service on a Kafka with an authorizer, derived from the topic catalog.

Each service gets exactly what it does, no more:

* **edge**: WRITE the request and cancellation topics and its announcements; READ the
  services' announcements; READ and CREATE its reply topic(s) ``<prefix>.replies.<edge_id>``.
* **worker**: READ requests as its consumer group (READ on the group), READ
  cancellations (no group: every worker reads all of them); WRITE every reply topic
  (``<prefix>.replies.*``), dead letters, the completions log and its announcements.

Announcement topics are whichever the catalog has (``services`` today), so the
grants follow the catalog as it changes. A consumer service added later gets an entry in :data:`SERVICES`. Operators, the CLI's
``send``, ``dlq`` and ``topics`` run with an admin (super) user.

``specstream kafka acls --print`` writes the grants as ``kafka-acls.sh`` commands;
``--apply`` creates them through the admin API (``--revoke`` deletes them).
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from aiokafka.errors import for_code
from aiokafka.protocol.admin import CreateAclsRequest, DeleteAclsRequest

from schemas.topics import Topic, TopicCatalog
from streams.kafka.connection import Connectable, settings_of

Operation = Literal["READ", "WRITE", "CREATE", "DESCRIBE"]
ResourceType = Literal["TOPIC", "GROUP"]

# Kafka's wire codes (org.apache.kafka.common.acl.AclOperation, resource.ResourceType, PatternType, AclPermissionType).
OPERATION_CODES: dict[str, int] = {"READ": 3, "WRITE": 4, "CREATE": 5, "DESCRIBE": 8}
_RESOURCE_CODES = {"TOPIC": 2, "GROUP": 3}
_LITERAL, _PREFIXED, _ALLOW = 3, 4, 3
_ANY_HOST = "*"


@dataclass(frozen=True)
class Grant:
    """One ACL: ``operation`` on a topic or group, by exact name or by name prefix."""

    operation: Operation
    resource_type: ResourceType
    name: str
    prefixed: bool = False
    topic: Topic | None = None  # the catalog topic of a literal topic grant (to create it)

    @property
    def resource(self) -> str:
        """``topic specstream.requests``, ``topic specstream.replies.*``, ``group specstream.engine-workers``."""
        return f"{self.resource_type.lower()} {self.name}{'*' if self.prefixed else ''}"


def announcement_topics(catalog: TopicCatalog) -> list[Topic]:
    """The catalog's announcement topics (``services``; the edges topic is topics gc's, granted apart)."""
    return [t for t in catalog.shared_topics() if t.carries.endswith("Announcement") and t.name != catalog.edges.name]


def _topic(operation: Operation, topic: Topic) -> Grant:
    return Grant(operation, "TOPIC", topic.name, topic=topic)


def edge_grants(catalog: TopicCatalog, edge_id: str | None = None) -> list[Grant]:
    """``edge_id`` limits the reply-topic grants to that edge's own topic; None: every edge's (a prefix)."""
    replies = catalog.replies(edge_id or "")
    own = [Grant(op, "TOPIC", replies.name, prefixed=edge_id is None) for op in ("READ", "CREATE")]
    return [
        _topic("WRITE", catalog.requests),
        _topic("WRITE", catalog.cancellations),
        _topic("WRITE", catalog.edges),  # its own announcements (reply-topic garbage collection)
        _topic("WRITE", catalog.services),
        *[_topic("READ", t) for t in announcement_topics(catalog)],  # /readyz
        _topic("READ", catalog.rollouts),  # canary routing
        _topic("READ", catalog.files),  # /v1/files: every file's metadata
        _topic("WRITE", catalog.files),
        _topic("WRITE", catalog.batch_lines),  # /v1/batches: a batch's lines
        _topic("READ", catalog.batches),  # /v1/batches: every batch's state
        _topic("WRITE", catalog.batches),
        _topic("WRITE", catalog.adapters),  # POST /v1/load_lora_adapter, /v1/unload_lora_adapter
        _topic("READ", catalog.responses),  # /v1/responses: stored responses, read whole
        _topic("WRITE", catalog.responses),
        Grant("WRITE", "TOPIC", f"{catalog.prefix}-candidate.", prefixed=True),  # a candidate pool's requests
        *own,
        *_vector_store_grants(catalog),
    ]


def _vector_store_grants(catalog: TopicCatalog) -> list[Grant]:
    """The vector store API (streams/edge/vector_stores.py): its tables, its writes, the retriever's input."""
    return [*[_topic(op, t) for t in (catalog.vector_stores, catalog.documents) for op in ("READ", "WRITE")],
            _topic("WRITE", catalog.ingest_jobs), _topic("WRITE", catalog.retrieval)]


def worker_grants(catalog: TopicCatalog, group_id: str) -> list[Grant]:
    return [
        _topic("READ", catalog.requests),
        Grant("READ", "GROUP", group_id),
        _topic("READ", catalog.cancellations),
        _topic("READ", catalog.adapters),  # the LoRA adapter registry, read whole at start
        Grant("WRITE", "TOPIC", catalog.replies("").name, prefixed=True),
        _topic("WRITE", catalog.dead_letters),
        _topic("WRITE", catalog.completions),  # one record per finished request (streams.eval)
        _topic("READ", catalog.completions),  # what every worker generated, for suffix decoding
        _topic("WRITE", catalog.tool_intents),  # server-side tool calls (streams.worker.tool_rounds)
        _topic("READ", catalog.tool_results),
        *[_topic("WRITE", t) for t in announcement_topics(catalog)],
        *batch_lane_grants(catalog),
    ]


def tool_runner_grants(catalog: TopicCatalog, group_id: str | None = None) -> list[Grant]:
    return [
        _topic("READ", catalog.tool_intents),
        Grant("READ", "GROUP", group_id or f"{catalog.prefix}.tool-runners"),
        _topic("WRITE", catalog.tool_results),
        _topic("WRITE", catalog.dead_letters),
        *[_topic("WRITE", t) for t in announcement_topics(catalog)],
        # file_search: the stores' table (tenant checks), the retriever's input, a reply topic of its own
        _topic("READ", catalog.vector_stores),
        _topic("WRITE", catalog.retrieval),
        *[Grant(op, "TOPIC", catalog.replies("tool-runner-").name, prefixed=True) for op in ("READ", "CREATE")],
    ]


def batch_lane_grants(catalog: TopicCatalog) -> list[Grant]:
    """A worker's batch lane (streams/worker/batch_lane.py): batch lines in as its own group, answers out, and
    every batch's state (to skip the lines of a cancelled one)."""
    return [
        _topic("READ", catalog.batch_lines),
        Grant("READ", "GROUP", f"{catalog.prefix}.batch-workers"),
        _topic("WRITE", catalog.batch_results),
        _topic("READ", catalog.batches),
    ]


def assembler_grants(catalog: TopicCatalog, group_id: str) -> list[Grant]:
    """The batch assembler: answers in as its group, every batch's state and file in and out."""
    return [
        _topic("READ", catalog.batch_results),
        Grant("READ", "GROUP", group_id),
        *[_topic(op, t) for t in (catalog.batches, catalog.files) for op in ("READ", "WRITE")],  # type: ignore[arg-type]
        _topic("WRITE", catalog.dead_letters),
        *[_topic("WRITE", t) for t in announcement_topics(catalog)],
    ]


@dataclass(frozen=True)
class Service:
    default_principal: str
    grants: Callable[[TopicCatalog, str, str | None], list[Grant]]  # (catalog, worker group id, edge id) -> grants


SERVICES: dict[str, Service] = {
    "edge": Service("User:specstream-edge", lambda catalog, group_id, edge_id: edge_grants(catalog, edge_id)),
    "worker": Service("User:specstream-worker", lambda catalog, group_id, edge_id: worker_grants(catalog, group_id)),
    "batch-assembler": Service("User:specstream-batch-assembler", lambda catalog, group_id, edge_id: assembler_grants(
        catalog, f"{catalog.prefix}.batch-assemblers")),
    "tool-runner": Service("User:specstream-tool-runner",
                           lambda catalog, group_id, edge_id: tool_runner_grants(catalog)),
}


def topics_of(grants: Iterable[Grant]) -> list[Topic]:
    """The catalog topics the grants name, once each, in order: what a service may create if missing."""
    seen: dict[str, Topic] = {}
    for grant in grants:
        if grant.topic is not None:
            seen.setdefault(grant.topic.name, grant.topic)
    return list(seen.values())


# --- printing and applying ------------------------------------------------------------------------------------------


def kafka_acls_commands(principal: str, grants: Sequence[Grant], bootstrap: str) -> list[str]:
    """The grants as ``kafka-acls.sh`` commands (run with an admin's ``--command-config``)."""
    lines = []
    for grant in grants:
        pattern = " --resource-pattern-type prefixed" if grant.prefixed else ""
        lines.append(f"kafka-acls.sh --bootstrap-server {bootstrap} --command-config admin.properties --add "
                     f"--allow-principal {principal} --operation {grant.operation} "
                     f"--{grant.resource_type.lower()} {grant.name}{pattern}")
    return lines


def _acl(grant: Grant, principal: str) -> tuple[int, str, int, str, str, int, int]:
    return (_RESOURCE_CODES[grant.resource_type], grant.name, _PREFIXED if grant.prefixed else _LITERAL,
            principal, _ANY_HOST, OPERATION_CODES[grant.operation], _ALLOW)


async def apply(kafka: Connectable, principal: str, grants: Sequence[Grant]) -> None:
    """Create the ACLs (creating one that exists is a no-op). Needs an admin user (ALTER on the cluster)."""
    await _send_each(kafka, [CreateAclsRequest(*_acl(grant, principal)) for grant in grants], "creation_responses")


async def revoke(kafka: Connectable, principal: str, grants: Sequence[Grant]) -> None:
    """Delete exactly these ACLs of ``principal``."""
    await _send_each(kafka, [DeleteAclsRequest(*_acl(grant, principal)) for grant in grants], "filter_responses")


async def _send_each(kafka: Connectable, requests: Sequence[CreateAclsRequest | DeleteAclsRequest], results: str) -> None:
    from aiokafka.errors import KafkaError

    from streams.kafka.clients import make_admin, start_admin

    admin = make_admin(kafka, client_id="specstream-acls")
    await start_admin(admin, kafka, 30.0)
    try:
        for request in requests:
            # The admin client has no ACL methods; its protocol classes do (any broker forwards to the controller).
            response = await admin._send_request(request)  # noqa: SLF001
            for result in getattr(response, results):
                code, message = result[0], result[1]
                if code:
                    raise KafkaError(f"kafka: ACL change refused by {settings_of(kafka).bootstrap_servers}: "
                                     f"{for_code(code).__name__}: {message or ''}".rstrip(": "))
    finally:
        await admin.close()
