"""The chat API's file_search tool and the vector store API's bodies: accepted in OpenAI's shapes, refused with a
400 naming the parameter."""
from __future__ import annotations

import pytest
from pydantic import ValidationError

from streams.edge.vector_store_bodies import AddBatch, Search, page
from streams.rag.filters import MAX_DEPTH, check_filter, to_qdrant
from streams.wire import errors
from streams.wire.bodies import ChatCompletionBody
from tests.import_checks import loaded_after

MESSAGES = [{"role": "user", "content": "What is the parrot called?"}]
SEARCH = {"type": "file_search", "vector_store_ids": ["vs_abc"], "max_num_results": 2}
FUNCTION = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object", "properties": {}}}}


def test_a_file_search_tool_is_accepted_next_to_functions_and_only_functions_reach_the_model() -> None:
    body = ChatCompletionBody.model_validate({"model": "m", "messages": MESSAGES, "tools": [SEARCH, FUNCTION]})
    tool = body.file_search()
    assert tool is not None and tool.vector_store_ids == ["vs_abc"] and tool.max_num_results == 2
    assert [t.name for t in body.wire_tools() or []] == ["lookup"]
    alone = ChatCompletionBody.model_validate({"model": "m", "messages": MESSAGES, "tools": [SEARCH]})
    assert alone.wire_tools() is None and alone.constraint() is None


@pytest.mark.parametrize(("tools", "param", "words"), [
    ([SEARCH, SEARCH], "tools", "At most one 'file_search' tool"),
    ([{**SEARCH, "filters": {"key": "a", "type": "near", "value": 1}}], "tools", "'near' is not one of"),
])
def test_bad_file_search_tools_are_400_naming_tools(tools: list[dict], param: str, words: str) -> None:
    body = ChatCompletionBody.model_validate({"model": "m", "messages": MESSAGES, "tools": tools})
    with pytest.raises(errors.EdgeError) as caught:
        body.file_search()
    assert caught.value.status == 400 and caught.value.param == param and words in caught.value.message


def test_a_file_search_tool_without_stores_names_the_field() -> None:
    with pytest.raises(ValidationError) as caught:
        ChatCompletionBody.model_validate({"model": "m", "messages": MESSAGES,
                                           "tools": [{"type": "file_search", "vector_store_ids": []}]})
    assert errors.from_validation_error(caught.value).param == "tools[0].vector_store_ids"


def test_a_batch_takes_exactly_one_of_file_ids_and_files_and_search_bounds_results() -> None:
    with pytest.raises(ValidationError, match="exactly one of 'file_ids' and 'files'"):
        AddBatch.model_validate({"file_ids": ["file-a"], "files": [{"file_id": "file-b"}]})
    batch = AddBatch.model_validate({"file_ids": ["file-a"], "attributes": {"year": 2020}})
    assert batch.entries()[0].attributes == {"year": 2020}
    with pytest.raises(ValidationError):
        Search.model_validate({"query": "x", "max_num_results": 51})
    assert Search.model_validate({"query": ["a", "b"]}).text() == "a b"


def test_lists_page_by_created_at_with_cursors() -> None:
    data = [{"id": f"o{i}", "created_at": i} for i in range(5)]
    first = page(data, limit=2, order="desc", after=None, before=None)
    assert [o["id"] for o in first["data"]] == ["o4", "o3"] and first["has_more"]
    second = page(data, limit=2, order="desc", after=first["last_id"], before=None)
    assert [o["id"] for o in second["data"]] == ["o2", "o1"] and second["first_id"] == "o2"


BAD_FILTERS = [
    ({"key": "a", "type": "near", "value": 1}, "filters.type: 'near' is not one of"),
    ({"type": "or", "filters": [{"key": "a", "type": "eq", "value": 1}, {"key": "b", "type": "gt", "value": "x"}]},
     r"filters.filters\[1\].value: a number is required for 'gt'"),
    ({"type": "and", "filters": []}, "filters.filters: a non-empty list is required for type 'and'"),
    ({"key": "", "type": "eq", "value": 1}, "filters.key: a non-empty string is required"),
    ({"key": "a", "type": "in", "value": [1.5]}, "filters.value: a non-empty list of strings or integers"),
    ({"key": "a", "type": "eq", "value": None}, "filters.value: a string, number or boolean is required"),
    ("year", "filters: expected an object"),
]


@pytest.mark.parametrize(("spec", "words"), BAD_FILTERS)
def test_a_bad_filter_is_refused_alike_by_the_check_and_by_the_conversion(spec: object, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        check_filter(spec)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=words):
        to_qdrant(spec)  # type: ignore[arg-type]


def test_filters_nested_past_the_limit_are_refused() -> None:
    spec: dict = {"key": "a", "type": "eq", "value": 1}
    for _ in range(MAX_DEPTH + 1):
        spec = {"type": "and", "filters": [spec]}
    with pytest.raises(ValueError, match=f"nest deeper than {MAX_DEPTH}"):
        check_filter(spec)


def test_each_comparison_becomes_its_qdrant_condition_on_the_points_attributes() -> None:
    from qdrant_client import models as qm

    year, topic = "attributes.year", "attributes.topic"
    spec = {"type": "or", "filters": [
        {"key": "year", "type": "gte", "value": 1900},
        {"type": "and", "filters": [{"key": "topic", "type": "ne", "value": "art"},
                                    {"key": "year", "type": "eq", "value": 2.5},
                                    {"key": "topic", "type": "nin", "value": ["a", "b"]}]},
    ]}
    assert to_qdrant(spec) == qm.Filter(should=[
        qm.FieldCondition(key=year, range=qm.Range(gte=1900)),
        qm.Filter(must=[
            qm.Filter(must_not=[qm.FieldCondition(key=topic, match=qm.MatchValue(value="art"))]),
            qm.FieldCondition(key=year, range=qm.Range(gte=2.5, lte=2.5)),
            qm.Filter(must_not=[qm.FieldCondition(key=topic, match=qm.MatchAny(any=["a", "b"]))]),
        ]),
    ])
    # A single comparison is wrapped in a filter; no filter is none.
    assert to_qdrant({"key": "year", "type": "eq", "value": 3}) == qm.Filter(
        must=[qm.FieldCondition(key=year, match=qm.MatchValue(value=3))])
    assert to_qdrant(None) is None and check_filter(None) is None


def test_the_edge_imports_neither_qdrant_nor_torch() -> None:
    """The edge only checks filters: qdrant_client's import was ~2.5 s of every edge start on 2 cores."""
    assert loaded_after("import streams.edge.app", ("qdrant_client", "torch", "transformers")) == []
