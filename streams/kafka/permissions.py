"""Does this Kafka user hold every grant its service needs? Checked at start, before serving.

A missing ACL would otherwise surface as a retry loop of library errors, or only
on the first request that needs it. Kafka answers the question itself: a Metadata
request (v8+) may ask for each topic's *authorized operations* for the asking
user, and DescribeGroups (v3+) the same for a group. aiokafka speaks Metadata
only up to v5 and misreads DescribeGroups v3, so both are declared here.

Prefixed grants (``WRITE topic specstream.replies.*``) are checked on the matching
topics the user can see; when there are none yet, a name under the prefix that
does not exist is asked for: the broker answers TOPIC_AUTHORIZATION_FAILED unless
the user holds some right under that prefix. CREATE is not checked here: creating
the topic at start is its own check (see :func:`streams.kafka.clients.ensure_topics`).
Without an authorizer the broker reports every operation as allowed.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import (
    GroupAuthorizationFailedError,
    GroupIdNotFound,
    KafkaError,
    TopicAuthorizationFailedError,
    for_code,
)
from aiokafka.protocol.admin import DescribeGroupsResponse_v3
from aiokafka.protocol.api import Request, RequestStruct, Response
from aiokafka.protocol.types import Array, Boolean, Int16, Int32, Schema, String

from schemas.topics import Topic
from streams.kafka.acls import OPERATION_CODES, Grant, topics_of
from streams.kafka.connection import Connectable, KafkaAccessError, not_authorized
from streams.kafka.clients import ensure_topics, make_admin, retrying, start_admin

_PROBE_SUFFIX = "__specstream-acl-probe"
_COORDINATOR_WAIT_S = 20.0  # for a fresh cluster's offsets topic
_TOPIC_AUTHORIZATION_FAILED = TopicAuthorizationFailedError.errno


class _MetadataResponseV8(Response):
    API_KEY = 3
    API_VERSION = 8
    SCHEMA = Schema(
        ("throttle_time_ms", Int32),
        ("brokers", Array(("node_id", Int32), ("host", String("utf-8")), ("port", Int32), ("rack", String("utf-8")))),
        ("cluster_id", String("utf-8")),
        ("controller_id", Int32),
        ("topics", Array(
            ("error_code", Int16),
            ("topic", String("utf-8")),
            ("is_internal", Boolean),
            ("partitions", Array(
                ("error_code", Int16), ("partition", Int32), ("leader", Int32), ("leader_epoch", Int32),
                ("replicas", Array(Int32)), ("isr", Array(Int32)), ("offline_replicas", Array(Int32)),
            )),
            ("topic_authorized_operations", Int32),
        )),
        ("cluster_authorized_operations", Int32),
    )


class _MetadataRequestV8(RequestStruct):
    API_KEY = 3
    API_VERSION = 8
    RESPONSE_TYPE = _MetadataResponseV8
    SCHEMA = Schema(
        ("topics", Array(String("utf-8"))),  # null: every topic the user may describe
        ("allow_auto_topic_creation", Boolean),
        ("include_cluster_authorized_operations", Boolean),
        ("include_topic_authorized_operations", Boolean),
    )


class _AuthorizedMetadataRequest(Request[_MetadataRequestV8]):
    API_KEY = 3

    def __init__(self, topics: list[str] | None) -> None:
        self._topics = topics

    def build(self, request_struct_class: type[_MetadataRequestV8]) -> _MetadataRequestV8:
        return request_struct_class(self._topics, False, False, True)


class _DescribeGroupsRequestV3(RequestStruct):
    # aiokafka's own v3 struct parses the answer as v2, dropping the authorized operations.
    API_KEY = 15
    API_VERSION = 3
    RESPONSE_TYPE = DescribeGroupsResponse_v3
    SCHEMA = Schema(("groups", Array(String("utf-8"))), ("include_authorized_operations", Boolean))


class _AuthorizedDescribeGroups(Request[_DescribeGroupsRequestV3]):
    API_KEY = 15

    def __init__(self, group: str) -> None:
        self._group = group

    def build(self, request_struct_class: type[_DescribeGroupsRequestV3]) -> _DescribeGroupsRequestV3:
        return request_struct_class([self._group], True)


def _allows(operations: int, operation: str) -> bool:
    return operations >= 0 and bool(operations & (1 << OPERATION_CODES[operation]))


async def _topic_operations(admin: AIOKafkaAdminClient, topics: list[str] | None) -> dict[str, tuple[int, int]]:
    """topic -> (error code, authorized operations bit field) for the asking user."""
    response: Any = await admin._send_request(_AuthorizedMetadataRequest(topics))  # noqa: SLF001 - see module doc
    return {name: (error, operations) for error, name, _internal, _parts, operations in response.topics}


async def _group_allows(admin: AIOKafkaAdminClient, group: str, operation: str) -> bool:
    async def operations() -> int:
        coordinator = await admin.find_coordinator(group)
        response: Any = await admin._send_request(_AuthorizedDescribeGroups(group), coordinator)  # noqa: SLF001
        error, _name, *_rest, allowed = response.groups[0]
        if error:
            raise for_code(error)(f"describing group {group}")
        return allowed

    try:
        # A fresh cluster creates and loads its offsets topic on the first coordinator lookup.
        return _allows(await retrying(operations, timeout_s=_COORDINATOR_WAIT_S, pause_s=0.5), operation)
    except GroupAuthorizationFailedError:
        return False
    except GroupIdNotFound:
        return True  # DESCRIBE was authorized, or the answer would say so; joining will check READ
    except KafkaError as error:
        if error.retriable:
            raise KafkaError(f"kafka: no coordinator answered for group {group}") from error
        raise


def _probe_name(grant: Grant) -> str:
    return grant.name + _PROBE_SUFFIX


async def missing_grants(kafka: Connectable, grants: Sequence[Grant]) -> list[Grant]:
    """The grants the connecting user lacks (empty: it may do everything listed)."""
    admin = make_admin(kafka, client_id="specstream-permissions")
    await start_admin(admin, kafka, 30.0)
    try:
        topic_grants = [g for g in grants if g.resource_type == "TOPIC" and g.operation != "CREATE"]
        visible = await _topic_operations(admin, None)
        unseen = sorted({g.name for g in topic_grants if not g.prefixed and g.name not in visible} |
                        {_probe_name(g) for g in topic_grants if g.prefixed})
        asked = await _topic_operations(admin, unseen) if unseen else {}
        missing = [g for g in topic_grants if not _topic_allows(g, visible, asked)]
        for grant in (g for g in grants if g.resource_type == "GROUP"):
            if not await _group_allows(admin, grant.name, grant.operation):
                missing.append(grant)
        return missing
    finally:
        await admin.close()


def _topic_allows(grant: Grant, visible: dict[str, tuple[int, int]], asked: dict[str, tuple[int, int]]) -> bool:
    if not grant.prefixed:
        error, operations = visible.get(grant.name) or asked.get(grant.name, (_TOPIC_AUTHORIZATION_FAILED, -1))
        # A topic that does not exist (yet) cannot be judged here; creating or using it will say so.
        return error != _TOPIC_AUTHORIZATION_FAILED and (error != 0 or _allows(operations, grant.operation))
    matching = [operations for name, (error, operations) in visible.items() if name.startswith(grant.name) and not error]
    if matching:
        return all(_allows(operations, grant.operation) for operations in matching)
    error, _operations = asked.get(_probe_name(grant), (_TOPIC_AUTHORIZATION_FAILED, -1))
    return error != _TOPIC_AUTHORIZATION_FAILED


async def prepare_service(kafka: Connectable, grants: Sequence[Grant], own_topics: Sequence[Topic] = (), *,
                          replication_factor: int, min_insync_replicas: int, client_id: str) -> list[str]:
    """A service's start: require every grant it needs, then create the topics it uses that are missing.

    Returns the names of those topics, which the service's start owns (streams.kafka.topic_watch restarts it when
    they vanish). Raises :class:`KafkaAccessError` (wrong credentials, untrusted certificate, missing ACL) in
    one line. Permissions first: a user who may not even see a topic would otherwise take it for missing and
    be refused its creation, which names the wrong cause.
    """
    await require(kafka, grants)
    topics = [*topics_of(grants), *own_topics]
    await ensure_topics(kafka, topics, replication_factor=replication_factor,
                        min_insync_replicas=min_insync_replicas, client_id=client_id)
    return list(dict.fromkeys(topic.name for topic in topics))


async def require(kafka: Connectable, grants: Sequence[Grant]) -> None:
    """Raise :class:`KafkaAccessError` naming every missing grant, in one line."""
    missing = await missing_grants(kafka, grants)
    if missing:
        raise KafkaAccessError(not_authorized(*(f"{g.operation} {g.resource}" for g in missing)))
