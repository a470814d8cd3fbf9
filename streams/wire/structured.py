"""OpenAI's structured-output parameters of the chat API: `tools`, `tool_choice`, `parallel_tool_calls`,
`response_format`, and what they become on the wire (the tools and the `OutputConstraint`).

Every schema is checked here, by the compiler the engine uses, so a schema that is not valid JSON
Schema or uses a feature constrained decoding cannot enforce is a 400 naming the parameter, before
anything reaches Kafka.
"""
from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool

from engine.grammar.constraint import ConstraintError, check_schema
from schemas.events import OutputConstraint, ToolSpec
from streams.rag.filters import check_filter
from streams.wire import errors

MAX_TOOLS = 64  # a longer tool list would crowd out the conversation in a small model's context
_NAME = r"^[a-zA-Z0-9_-]{1,64}$"  # OpenAI's rule for function names


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class FunctionDefinition(_Strict):
    name: str = Field(pattern=_NAME, description="a-z, A-Z, 0-9, _ and -, at most 64.")
    description: str | None = None
    parameters: dict[str, Any] | None = Field(default=None, description="JSON schema of the arguments.")
    strict: StrictBool | None = Field(default=None, description="Arguments always follow the schema here.")


class FunctionTool(_Strict):
    type: Literal["function"]
    function: FunctionDefinition


class FileSearchTool(_Strict):
    """The Responses API's file_search tool: the rag service grounds the request with the stores' best passages
    (streams/rag/retriever.py) and the answer carries them as file_citation annotations."""

    type: Literal["file_search"]
    vector_store_ids: list[str] = Field(min_length=1, max_length=8, description="The stores to search.")
    max_num_results: int | None = Field(default=None, ge=1, le=50, description="Passages given to the model.")
    filters: dict[str, Any] | None = Field(default=None, description="OpenAI's attribute filter.")


Tool = Annotated[FunctionTool | FileSearchTool, Field(discriminator="type")]


class _NamedFunction(_Strict):
    name: str


class NamedToolChoice(_Strict):
    type: Literal["function"]
    function: _NamedFunction


class JsonSchemaFormat(_Strict):
    name: str = Field(pattern=_NAME)
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: StrictBool | None = None


class TextFormat(_Strict):
    type: Literal["text"]


class JsonObjectFormat(_Strict):
    type: Literal["json_object"]


class JsonSchemaResponseFormat(_Strict):
    type: Literal["json_schema"]
    json_schema: JsonSchemaFormat


ResponseFormat = Annotated[TextFormat | JsonObjectFormat | JsonSchemaResponseFormat, Field(discriminator="type")]
ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


def _bad(message: str, param: str, code: str = "invalid_value") -> errors.EdgeError:
    return errors.EdgeError(400, message, param=param, code=code)


def _checked(schema: dict[str, Any], param: str) -> None:
    try:
        check_schema(schema)
    except ConstraintError as error:
        raise _bad(f"Invalid schema for '{param}': {error}", param, "invalid_schema") from None


def wire_tools(tools: list[Tool] | None, tool_choice: ToolChoice | None) -> list[ToolSpec] | None:
    """The tools the model is offered (none with tool_choice "none"), each schema checked."""
    functions = [t for t in tools or [] if isinstance(t, FunctionTool)]
    if not functions or tool_choice == "none":
        return None
    tools = functions
    names = [t.function.name for t in tools]
    if len(set(names)) != len(names):
        raise _bad("Function names in 'tools' must be unique.", "tools")
    for i, tool in enumerate(tools):
        if tool.function.parameters is not None:
            _checked(tool.function.parameters, f"tools[{i}].function.parameters")
    return [ToolSpec(name=t.function.name, description=t.function.description,
                     **({} if t.function.parameters is None else {"parameters": t.function.parameters}))
            for t in tools]


def file_search(tools: list[Tool] | None) -> FileSearchTool | None:
    """The request's file_search tool (at most one, with its filter checked), or None."""
    searches = [t for t in tools or [] if isinstance(t, FileSearchTool)]
    if len(searches) > 1:
        raise _bad("At most one 'file_search' tool may be given.", "tools")
    if searches and searches[0].filters is not None:
        try:
            check_filter(searches[0].filters)
        except ValueError as error:
            raise _bad(f"Invalid value for 'tools[].filters': {error}", "tools") from None
    return searches[0] if searches else None


def output_constraint(
    tools: list[ToolSpec] | None,
    tool_choice: ToolChoice | None,
    parallel_tool_calls: bool | None,
    response_format: TextFormat | JsonObjectFormat | JsonSchemaResponseFormat | None,
) -> OutputConstraint | None:
    """What the output must match: tool calls when tools are offered, else the response format's JSON."""
    if tools is None and tool_choice not in (None, "none", "auto"):
        raise _bad("'tool_choice' requires 'tools'.", "tool_choice")
    if tools is not None:
        if response_format is not None and response_format.type != "text":
            raise _bad("'response_format' cannot be combined with 'tools' (the answer is text or tool calls).",
                       "response_format", "unsupported_value")
        choice = tool_choice.function.name if isinstance(tool_choice, NamedToolChoice) else (tool_choice or "auto")
        if isinstance(tool_choice, NamedToolChoice) and choice not in {t.name for t in tools}:
            raise _bad(f"'tool_choice' names function '{choice}', which is not in 'tools'.", "tool_choice")
        return OutputConstraint(kind="tool_calls", tool_choice=choice,
                                parallel_tool_calls=parallel_tool_calls is not False)
    if isinstance(response_format, JsonObjectFormat):
        return OutputConstraint(kind="json")
    if isinstance(response_format, JsonSchemaResponseFormat):
        schema = response_format.json_schema.schema_
        if schema is None:
            return OutputConstraint(kind="json")
        _checked(schema, "response_format.json_schema.schema")
        return OutputConstraint(kind="json", json_schema=schema)
    return None
