"""The chat API's file_search tool and the vector store API's bodies: accepted in OpenAI's shapes, refused with a
400 naming the parameter."""
from __future__ import annotations

import pytest
from pydantic import ValidationError

from streams.edge import errors
from streams.edge.admission.bodies import ChatCompletionBody
from streams.edge.vector_store_bodies import AddBatch, Search, page

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
