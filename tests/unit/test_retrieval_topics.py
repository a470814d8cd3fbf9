"""Users' searches and index administration on topics of their own: each topic's event takes only its own ops and
says where the other ones go; the retriever answers a tenant only from its own stores; only operators write the
index-commands topic."""
from __future__ import annotations

import json
import time
from typing import Any

import pytest

from schemas.events import ChatMessage, GenerateRequest, ReplyRoute
from schemas.retrieval import IndexCommand, RetrievalRequest, VectorStoreRecord
from schemas.topics import TopicCatalog
from streams.kafka.acls import edge_grants, tool_runner_grants
from streams.rag.retriever import refusal
from streams.service.intake import Rejection, parse_message

LIMIT = 64 * 1024
ROUTE = {"topic": "p.replies.e1"}


def _search(**overrides: Any) -> dict[str, Any]:
    return {"type": "retrieval_request", "request_id": "q1", "reply_to": ROUTE, "tenant": "acme", "op": "search",
            "search": {"vector_store_ids": ["vs_a"], "query": "lighthouse"}, **overrides}


def _command(**overrides: Any) -> dict[str, Any]:
    return {"type": "index_command", "request_id": "c1", "reply_to": ROUTE, "op": "count",
            "vector_store_id": "vs_a", "version": 1, **overrides}


def _parsed(body: dict[str, Any], model: type[RetrievalRequest] | type[IndexCommand]) -> Any:
    return parse_message(json.dumps(body).encode(), model, max_bytes=LIMIT)


@pytest.mark.parametrize("op", ["prepare", "swap", "count", "canary"])
def test_an_index_op_on_the_retrieval_topic_is_dead_lettered_naming_the_index_commands_topic(op: str) -> None:
    rejection = _parsed(_search(op=op), RetrievalRequest)
    assert isinstance(rejection, Rejection) and rejection.dead_letter and rejection.code == "invalid_request"
    assert rejection.message == (f"op '{op}' is index administration: publish an IndexCommand to the index-commands "
                                 "topic; the retrieval topic carries users' searches (search, chat)")
    assert rejection.route == ReplyRoute(topic="p.replies.e1") and rejection.request_id == "q1"  # the sender hears why


@pytest.mark.parametrize("op", ["search", "chat"])
def test_a_user_op_on_the_index_commands_topic_is_dead_lettered_naming_the_retrieval_topic(op: str) -> None:
    rejection = _parsed(_command(op=op), IndexCommand)
    assert isinstance(rejection, Rejection) and rejection.dead_letter
    assert rejection.message.startswith(f"op '{op}' is a user's operation: publish a RetrievalRequest to the "
                                        "retrieval topic, where the retriever checks its tenant")


def test_a_whole_message_of_the_other_topic_gets_the_one_reason_of_its_op() -> None:
    rejection = _parsed(_command(op="swap", version=2), RetrievalRequest)
    assert isinstance(rejection, Rejection) and rejection.message.startswith("op 'swap' is index administration")
    rejection = _parsed(_search(), IndexCommand)
    assert isinstance(rejection, Rejection) and rejection.message.startswith("op 'search' is a user's operation")


def test_each_topic_takes_its_own_ops() -> None:
    assert _parsed(_search(), RetrievalRequest).op == "search"
    for op in ("prepare", "swap", "count"):
        assert _parsed(_command(op=op), IndexCommand).op == op
    assert _parsed(_command(op="canary", query="lighthouse"), IndexCommand).query == "lighthouse"


def test_a_users_search_cannot_pin_an_index_version() -> None:
    rejection = _parsed(_search(version=2), RetrievalRequest)
    assert isinstance(rejection, Rejection) and rejection.message == "unknown field 'version'"


def test_a_canary_needs_a_query_and_no_other_command_takes_one() -> None:
    for body in (_command(op="canary"), _command(op="count", query="lighthouse")):
        rejection = _parsed(body, IndexCommand)
        assert isinstance(rejection, Rejection) and rejection.message == "query is set exactly when op is canary"


def test_a_command_names_its_store_and_version() -> None:
    rejection = _parsed({k: v for k, v in _command().items() if k != "version"}, IndexCommand)
    assert isinstance(rejection, Rejection) and rejection.message == "version: Field required"


@pytest.mark.parametrize("model, body", [(RetrievalRequest, _search()), (IndexCommand, _command())])
def test_both_topics_refuse_an_unknown_schema_version_and_an_oversized_message(
        model: type[RetrievalRequest] | type[IndexCommand], body: dict[str, Any]) -> None:
    rejection = _parsed({**body, "schema_version": 2}, model)
    assert isinstance(rejection, Rejection) and rejection.code == "unsupported_schema_version" and rejection.dead_letter
    oversized = parse_message(json.dumps({**body, "pad": "x" * LIMIT}).encode(), model, max_bytes=LIMIT)
    assert isinstance(oversized, Rejection) and oversized.code == "message_too_large" and oversized.dead_letter


def _store(store_id: str, tenant: str) -> VectorStoreRecord:
    return VectorStoreRecord(id=store_id, tenant=tenant, created_at=0, updated_at=time.time())


def _request(op: str, tenant: str, stores: list[str]) -> RetrievalRequest:
    generate = GenerateRequest(request_id="q1", model="m", messages=[ChatMessage(role="user", content="hi")],
                               reply_to=ReplyRoute(topic="p.replies.e1"), tenant=tenant) if op == "chat" else None
    return RetrievalRequest.model_validate(_search(op=op, tenant=tenant, generate=generate,
                                                   search={"vector_store_ids": stores}))


@pytest.mark.parametrize("op", ["search", "chat"])
def test_the_retriever_refuses_every_user_op_on_a_store_of_another_tenant_as_if_it_did_not_exist(op: str) -> None:
    records = {"vs_a": _store("vs_a", "acme"), "vs_b": _store("vs_b", "globex"), "vs_gone": None}
    assert refusal(_request(op, "acme", ["vs_a"]), records) is None
    for stores in (["vs_a", "vs_b"], ["vs_gone"]):
        refused = refusal(_request(op, "acme", stores), records)
        assert refused is not None and refused.code == "invalid_request" and refused.param == "vector_store_ids"
        assert refused.message == f"No vector store found with id '{stores[-1]}' for tenant 'acme'."


def test_the_edge_and_the_tool_runner_may_search_but_only_operators_write_index_commands() -> None:
    catalog = TopicCatalog(prefix="p")
    for grants in (edge_grants(catalog), tool_runner_grants(catalog)):
        written = {g.name for g in grants if g.operation == "WRITE"}
        assert catalog.retrieval.name in written and catalog.index_commands.name not in written


def test_the_catalog_creates_both_topics() -> None:
    catalog = TopicCatalog(prefix="p")
    names = [t.name for t in catalog.shared_topics()]
    assert {"p.retrieval", "p.index-commands"} <= set(names) and len(names) == len(set(names))
    assert (catalog.retrieval.carries, catalog.index_commands.carries) == ("RetrievalRequest", "IndexCommand")
