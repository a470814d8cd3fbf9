"""The file_search tool without a broker: its registry entry, the schema of its arguments, and how its results are
kept within the tool's output limit."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from schemas.retrieval import Passage
from schemas.tools import ToolError, ToolIntent
from streams.config import ConfigError, load_settings
from streams.config.tools import ToolSettings, ToolsSettings
from streams.tools.checks import refusal
from streams.tools.file_search import results_output, search_of


def passage(text: str, score: float, file_id: str = "file-a") -> Passage:
    return Passage(vector_store_id="vs_a", file_id=file_id, filename=f"{file_id}.md", score=score, text=text,
                   chunk_index=0, char_start=0, char_end=len(text))


def intent(arguments: dict[str, object]) -> ToolIntent:
    return ToolIntent(request_id="r", call_id="c", tool="file_search", arguments=arguments, tenant="default")


def test_file_search_ships_in_the_default_registry_with_no_store_of_its_own() -> None:
    tool = ToolsSettings().registry["file_search"]
    assert tool.executor == "file_search" and tool.vector_store_ids == []
    assert refusal(intent({"query": "lighthouse", "max_num_results": 3, "vector_store_ids": ["vs_a"]}),
                   ToolsSettings().registry) is None


@pytest.mark.parametrize(("arguments", "where"), [
    ({}, "(the arguments): 'query' is a required property"),
    ({"query": ""}, "at query:"),
    ({"query": "x", "max_num_results": 0}, "at max_num_results: 0 is less than the minimum of 1"),
    ({"query": "x", "vector_store_ids": "vs_a"}, "at vector_store_ids: 'vs_a' is not of type 'array'"),
    ({"query": "x", "path": "/etc"}, "Additional properties are not allowed ('path' was unexpected)"),
])
def test_bad_file_search_arguments_are_rejected_naming_the_field(arguments: dict[str, object], where: str) -> None:
    refused = refusal(intent(arguments), ToolsSettings().registry)
    assert refused is not None and refused.code == "rejected" and where in refused.message


def test_vector_store_ids_in_the_config_belong_to_file_search_tools_only(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("tools:\n  registry:\n    calc:\n      executor: calculator\n      parameters: {}\n"
                      "      vector_store_ids: [vs_a]\n")
    with pytest.raises(ConfigError, match="vector_store_ids is for the file_search executor, not calculator"):
        load_settings(config)


def test_results_within_the_limit_are_all_kept_best_first_and_not_truncated() -> None:
    output, truncated = results_output([passage("first", 0.9), passage("second", 0.5, "file-b")], 4096)
    assert not truncated
    assert [(r["file_id"], r["filename"], r["score"], r["text"]) for r in output["results"]] == [
        ("file-a", "file-a.md", 0.9, "first"), ("file-b", "file-b.md", 0.5, "second")]


def test_results_past_the_limit_drop_the_lowest_scores_and_say_truncated() -> None:
    passages = [passage("x" * 200, 0.9 - i / 10, f"file-{i}") for i in range(5)]
    output, truncated = results_output(passages, 700)
    assert truncated and 1 <= len(output["results"]) < 5
    assert [r["file_id"] for r in output["results"]] == [f"file-{i}" for i in range(len(output["results"]))]
    assert len(json.dumps(output, ensure_ascii=False).encode()) <= 700


def test_a_first_result_larger_than_the_limit_has_its_text_cut_to_fit() -> None:
    output, truncated = results_output([passage("é" * 5000, 0.8)], 512)
    assert truncated and len(output["results"]) == 1
    assert 0 < len(output["results"][0]["text"]) < 5000
    assert len(json.dumps(output, ensure_ascii=False).encode()) <= 512


@pytest.mark.parametrize(("arguments", "message"), [
    ({}, "at query: a non-empty string is required"),
    ({"query": "   "}, "at query: a non-empty string is required"),
    ({"query": "x", "max_num_results": 99}, "at max_num_results: Input should be less than or equal to 50"),
    ({"query": "x", "vector_store_ids": [f"vs_{i}" for i in range(9)]}, "at vector_store_ids: List should have at most 8"),
])
def test_a_lax_operator_schema_still_gets_bad_arguments_rejected_not_crashed(arguments: dict[str, object],
                                                                               message: str) -> None:
    lax = ToolSettings(executor="file_search", parameters={}, vector_store_ids=["vs_a"])
    refused = search_of(lax, arguments)
    assert isinstance(refused, ToolError) and refused.code == "rejected" and message in refused.message


def test_the_calls_stores_come_first_then_the_tools_and_none_is_rejected() -> None:
    configured = ToolSettings(executor="file_search", parameters={}, vector_store_ids=["vs_a"])
    assert search_of(configured, {"query": "q"}).vector_store_ids == ["vs_a"]  # type: ignore[union-attr]
    assert search_of(configured, {"query": "q", "vector_store_ids": ["vs_b"]}).vector_store_ids == ["vs_b"]  # type: ignore[union-attr]
    none = search_of(ToolSettings(executor="file_search", parameters={}), {"query": "q"})
    assert isinstance(none, ToolError) and "the call names none (vector_store_ids) and the tool configures none" in \
        none.message
