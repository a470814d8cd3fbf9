"""The Responses API's request body (``POST /v1/responses``), in OpenAI's shapes, mapped onto the chat path.

A Responses request is a chat request written differently: ``input`` (a string, or message, ``function_call`` and
``function_call_output`` items) and ``instructions`` become the conversation; flat function tools, a flat named
``tool_choice`` and ``text.format`` become the chat API's tools, tool choice and response format, checked by the
same code (:mod:`streams.wire.structured`) with errors renamed to the Responses fields. The body is a
:class:`~streams.wire.bodies.Body`, so it passes the same admission pipeline as a chat request.

What the chat path cannot honour yet is refused by name: the parameters of :data:`UNSUPPORTED` unless neutral,
the chat-only sampling fields the Responses API does not have (``max_tokens``, ``stop``, ``n``, the OpenAI
penalties, ``logit_bias``, ``stream_options``) as unknown, and input content that is not text (images, files, item
references). vLLM's sampling extensions (``top_k``, ``min_p``, ``repetition_penalty``, ``min_tokens``, ...) are
honoured as on chat.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    PrivateAttr,
    StrictBool,
    StrictInt,
    Tag,
    model_validator,
)
from pydantic.json_schema import SkipJsonSchema

from schemas.events import ChatMessage, OutputConstraint, ToolCall, ToolSpec
from streams.wire import errors
from streams.wire.bodies import Body
from streams.wire.structured import (
    MAX_TOOLS,
    FileSearchTool,
    FunctionDefinition,
    FunctionTool,
    JsonObjectFormat,
    JsonSchemaFormat,
    JsonSchemaResponseFormat,
    NamedToolChoice,
    TextFormat,
    file_search,
    output_constraint,
    wire_tools,
)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _any(value: Any) -> bool:
    return True


# Responses parameters the chat path cannot honour yet: name -> is this value neutral? (refused otherwise)
UNSUPPORTED: dict[str, Callable[[Any], bool]] = {
    "background": lambda v: v in (None, False),
    "conversation": lambda v: v is None,
    "include": lambda v: v in (None, []),
    "max_tool_calls": lambda v: v is None,
    "prompt": lambda v: v is None,
    "reasoning": lambda v: v in (None, {}),
    "service_tier": lambda v: v in (None, "auto", "default"),
    "top_logprobs": lambda v: v in (None, 0),
    "truncation": lambda v: v in (None, "disabled"),
    "context_management": lambda v: v in (None, []),
    "safety_identifier": _any,  # end-user identification: changes nothing about the answer
    "prompt_cache_retention": _any,
}
# The shared Body's chat-only fields: not Responses parameters, so a typo-like unknown_parameter here.
_CHAT_ONLY = ("max_tokens", "stop", "n", "frequency_penalty", "presence_penalty", "logit_bias", "stream_options")


class InputText(_Strict):
    type: Literal["input_text"]
    text: str


class OutputText(_Strict):
    """An earlier answer's text, as a client sends a response's output back."""

    type: Literal["output_text"]
    text: str
    annotations: list[dict[str, Any]] = Field(default_factory=list)
    logprobs: list[dict[str, Any]] | None = None


TextContent = Annotated[InputText | OutputText, Field(discriminator="type")]


def _text(content: str | list[InputText | OutputText]) -> str:
    return content if isinstance(content, str) else "".join(p.text for p in content)


class MessageItem(_Strict):
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[TextContent] = Field(description="Text, or input_text / output_text parts that are joined.")
    id: str | None = None
    status: str | None = None
    phase: Literal["commentary", "final_answer"] | None = None


class FunctionCallItem(_Strict):
    type: Literal["function_call"]
    call_id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    arguments: str
    id: str | None = None
    status: str | None = None


class FunctionCallOutputItem(_Strict):
    type: Literal["function_call_output"]
    call_id: str = Field(min_length=1)
    output: str | list[InputText]
    id: str | None = None
    status: str | None = None


_ITEM_KINDS = ("message", "function_call", "function_call_output")
_PART_KINDS = ("input_text", "output_text")


def _unsupported_value(message: str, param: str) -> errors.EdgeError:
    return errors.EdgeError(400, message, param=param, code="unsupported_value")


def _check_item_kinds(items: Any) -> None:
    """Input the chat path cannot take (images, files, item references, ...) is refused naming where it is."""
    if not isinstance(items, list):
        return
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            continue
        kind = item.get("type", "message")
        if kind not in _ITEM_KINDS:
            raise _unsupported_value(f"Input items of type {kind!r} are not supported; only {', '.join(_ITEM_KINDS)}.",
                                     f"input[{i}].type")
        parts = item.get("content") if kind == "message" else item.get("output")
        for j, part in enumerate(parts if isinstance(parts, list) else []):
            if isinstance(part, dict) and part.get("type") not in _PART_KINDS:
                where = "content" if kind == "message" else "output"
                raise _unsupported_value(f"Content of type {part.get('type')!r} is not supported; only text.",
                                         f"input[{i}].{where}[{j}].type")


def _item_kind(value: Any) -> str:
    kind = value.get("type", "message") if isinstance(value, dict) else getattr(value, "type", "message")
    return kind if isinstance(kind, str) else "message"


InputItem = Annotated[
    Annotated[MessageItem, Tag("message")] | Annotated[FunctionCallItem, Tag("function_call")]
    | Annotated[FunctionCallOutputItem, Tag("function_call_output")],
    Discriminator(_item_kind),
]


class ResponsesFunctionTool(_Strict):
    type: Literal["function"]
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: StrictBool | None = None


ResponsesTool = Annotated[ResponsesFunctionTool | FileSearchTool, Field(discriminator="type")]


class FunctionChoice(_Strict):
    type: Literal["function"]
    name: str


class JsonSchemaText(_Strict):
    type: Literal["json_schema"]
    name: str
    schema_: dict[str, Any] = Field(alias="schema")
    description: str | None = None
    strict: StrictBool | None = None


TextFormatParam = Annotated[TextFormat | JsonObjectFormat | JsonSchemaText, Field(discriminator="type")]


class TextConfig(_Strict):
    format: TextFormatParam | None = None
    verbosity: Literal["medium"] | None = Field(default=None, description="Only the default (medium) is supported.")


def _renamed(param: str | None) -> str | None:
    """A chat-path error's parameter, in the Responses API's names."""
    if param is None:
        return None
    return (param.replace("response_format.json_schema.", "text.format.").replace("response_format", "text.format")
            .replace(".function.", "."))


def _unknown(name: str) -> errors.EdgeError:
    return errors.EdgeError(400, f"Unrecognized request argument supplied: {name}", param=name,
                            code="unknown_parameter")


class ResponsesBody(Body):
    api: ClassVar[str] = "responses"
    unsupported: ClassVar[frozenset[str]] = frozenset()  # refused by _refuse_unsupported, with the Responses' rules

    input: str | list[InputItem] = Field(description="Text, or a list of message / function_call / "
                                         "function_call_output items.")
    instructions: str | None = Field(default=None, description="A system message put first (not carried over by "
                                     "previous_response_id).")
    max_output_tokens: StrictInt | None = Field(default=None, ge=16, le=32768, description="Most tokens to generate.")
    text: TextConfig | None = None
    tools: list[ResponsesTool] | None = Field(default=None, max_length=MAX_TOOLS)
    tool_choice: Literal["none", "auto", "required"] | FunctionChoice | None = None
    parallel_tool_calls: StrictBool | None = None
    metadata: dict[str, Annotated[str, Field(max_length=512)]] | None = Field(default=None, max_length=16)
    store: StrictBool | None = Field(default=None, description="Keep the response (default true) for GET and "
                                     "previous_response_id.")
    previous_response_id: str | None = Field(default=None, min_length=1)
    prompt_cache_key: str | None = Field(default=None, min_length=1, max_length=128)
    # The shared Body's chat-only fields, out of this API (refused by _refuse_unsupported, left out of its schema).
    max_tokens: SkipJsonSchema[None] = None
    stop: SkipJsonSchema[None] = None
    n: SkipJsonSchema[None] = None
    frequency_penalty: SkipJsonSchema[None] = None
    presence_penalty: SkipJsonSchema[None] = None
    stream_options: SkipJsonSchema[None] = None

    # The stored conversation previous_response_id continues (set by the route before the request is built).
    _history: list[dict[str, Any]] = PrivateAttr(default_factory=list)

    @model_validator(mode="before")
    @classmethod
    def _refuse_unsupported(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        for name in _CHAT_ONLY:
            if name in data:
                raise _unknown(name)
        _check_item_kinds(data.get("input"))
        out = dict(data)
        for name, neutral in UNSUPPORTED.items():
            if name in data:
                if not neutral(data[name]):
                    raise errors.EdgeError(400, f"'{name}' is not supported by this server; remove it from the "
                                           "request.", param=name, code="unsupported_parameter")
                del out[name]
        return out

    # --- what the pipeline asks of a body ------------------------------------------------------------------------

    def max_new_tokens(self) -> int | None:
        return self.max_output_tokens

    def conversation_key(self) -> str | None:
        return self.prompt_cache_key

    @property
    def input_param(self) -> str:
        return "input"

    @property
    def stores(self) -> bool:
        return self.store is not False

    def input_items(self) -> list[dict[str, Any]]:
        """This request's input as items (a string is one user message), JSON as they are stored."""
        if isinstance(self.input, str):
            return [{"type": "message", "role": "user", "content": self.input}]
        return [item.model_dump(mode="json", by_alias=True, exclude_none=True) for item in self.input]

    def conversation(self) -> list[dict[str, Any]]:
        """The earlier conversation (previous_response_id), then this input: what a stored response keeps."""
        return [*self._history, *self.input_items()]

    def continue_from(self, history: list[dict[str, Any]]) -> None:
        self._history = list(history)

    def chat_input(self) -> list[ChatMessage] | None:
        system = [ChatMessage(role="system", content=self.instructions)] if self.instructions is not None else []
        return system + chat_messages(self.conversation())

    def _chat_tools(self) -> list[FunctionTool | FileSearchTool] | None:
        if self.tools is None:
            return None
        return [FunctionTool(type="function", function=FunctionDefinition(
                    name=t.name, description=t.description, parameters=t.parameters, strict=t.strict))
                if isinstance(t, ResponsesFunctionTool) else t for t in self.tools]

    def _chat_choice(self) -> Literal["none", "auto", "required"] | NamedToolChoice | None:
        if isinstance(self.tool_choice, FunctionChoice):
            return NamedToolChoice(type="function", function={"name": self.tool_choice.name})  # type: ignore[arg-type]
        return self.tool_choice

    def _chat_format(self) -> TextFormat | JsonObjectFormat | JsonSchemaResponseFormat | None:
        fmt = self.text.format if self.text is not None else None
        if isinstance(fmt, JsonSchemaText):
            return JsonSchemaResponseFormat(type="json_schema", json_schema=JsonSchemaFormat(
                name=fmt.name, description=fmt.description, schema=fmt.schema_, strict=fmt.strict))
        return fmt

    def wire_tools(self) -> list[ToolSpec] | None:
        with _responses_names():
            return wire_tools(self._chat_tools(), self._chat_choice())

    def file_search(self) -> FileSearchTool | None:
        with _responses_names():
            return file_search(self._chat_tools())

    def constraint(self) -> OutputConstraint | None:
        with _responses_names():
            return output_constraint(self.wire_tools(), self._chat_choice(), self.parallel_tool_calls,
                                     self._chat_format())


@contextmanager
def _responses_names() -> Iterator[None]:
    """Rename the parameter of a chat-path error to the Responses API's field."""
    try:
        yield
    except errors.EdgeError as error:
        error.param = _renamed(error.param)
        error.message = _renamed(error.message) or error.message
        raise


def chat_messages(items: list[dict[str, Any]]) -> list[ChatMessage]:
    """Responses items as the chat template's messages: consecutive function calls join the assistant message
    before them (one chat turn), and each function_call_output is a tool message."""
    messages: list[ChatMessage] = []
    for item in items:
        kind = item.get("type", "message")
        if kind == "function_call":
            call = ToolCall(id=item["call_id"], name=item["name"], arguments=item["arguments"])
            last = messages[-1] if messages else None
            if last is not None and last.role == "assistant":
                messages[-1] = last.model_copy(update={"tool_calls": [*(last.tool_calls or []), call]})
            else:
                messages.append(ChatMessage(role="assistant", content="", tool_calls=[call]))
        elif kind == "function_call_output":
            output = item["output"]
            text = output if isinstance(output, str) else "".join(p["text"] for p in output)
            messages.append(ChatMessage(role="tool", content=text, tool_call_id=item["call_id"]))
        else:
            content = item["content"]
            text = content if isinstance(content, str) else "".join(p["text"] for p in content)
            role = "system" if item["role"] in ("system", "developer") else item["role"]
            messages.append(ChatMessage(role=role, content=text))
    return messages
