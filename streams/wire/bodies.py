"""What each API accepts: the typed request bodies, one pydantic model per API, forbidding unknown fields.

A body class is the whole description of its API: its fields (with ranges,
in OpenAI's names), the OpenAI parameters it knows but the engine does not
implement (``unsupported``, accepted only with their neutral value), the name
of its prompt field (``input_param``), and how it turns into the wire
request's input. Adding a parameter is adding a field here (and, when the
engine needs it, mapping it in :mod:`streams.wire.build`); adding
an API is adding a class.

A few OpenAI parameters the engine does not implement are accepted only with
their neutral value (``n=1`` when streaming, ``echo`` false with ``n`` > 1); the validators say so with
``unsupported_value``.
"""
from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    field_validator,
    model_validator,
)

from schemas.events import ChatMessage, OutputConstraint, ToolCall, ToolSpec
from streams.wire import errors
from streams.wire.structured import (
    MAX_TOOLS,
    FileSearchTool,
    ResponseFormat,
    Tool,
    ToolChoice,
    file_search,
    output_constraint,
    wire_tools,
)
from streams.wire.unsupported import FOR_CHAT, FOR_COMPLETIONS


class _Strict(BaseModel):
    """Unknown fields are errors, and numbers and booleans are strict (StrictInt, ...): JSON ``true`` is not 1 nor
    ``"5"`` 5, as in OpenAI's API; an integer is still a valid float."""

    model_config = ConfigDict(extra="forbid")


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class FunctionCallParam(_Strict):
    name: str = Field(min_length=1, description="The function called.")
    arguments: str = Field(description="The arguments, as JSON text.")


class ToolCallParam(_Strict):
    id: str = Field(min_length=1)
    type: Literal["function"]
    function: FunctionCallParam


# A prompt given as token ids (completions): a non-empty list of integers, as OpenAI's and vLLM's APIs take it.
TokenIds = Annotated[list[Annotated[StrictInt, Field(ge=0)]], Field(min_length=1)]


def _text(content: str | list[TextPart] | None) -> str:
    return content if isinstance(content, str) else "".join(p.text for p in content or [])


class _Message(_Strict):
    content: str | list[TextPart] = Field(description="Text, or a list of text parts that are joined.")
    name: str | None = Field(default=None, description="Author's name; accepted and ignored.")

    def to_schema(self) -> ChatMessage:
        raise NotImplementedError


class SystemMessageParam(_Message):
    role: Literal["system", "developer"] = Field(description="developer is treated as system.")

    def to_schema(self) -> ChatMessage:
        return ChatMessage(role="system", content=_text(self.content))


class UserMessageParam(_Message):
    role: Literal["user"]

    def to_schema(self) -> ChatMessage:
        return ChatMessage(role="user", content=_text(self.content))


class AssistantMessageParam(_Message):
    role: Literal["assistant"]
    content: str | list[TextPart] | None = Field(default=None, description="Null or absent with tool_calls.")
    tool_calls: list[ToolCallParam] | None = Field(default=None, description="The calls this answer made.")

    @model_validator(mode="after")
    def _content_or_calls(self) -> AssistantMessageParam:
        if self.content is None and not self.tool_calls:
            raise ValueError("an assistant message needs 'content' or 'tool_calls'")
        return self

    def to_schema(self) -> ChatMessage:
        calls = None if not self.tool_calls else [
            ToolCall(id=c.id, name=c.function.name, arguments=c.function.arguments) for c in self.tool_calls]
        return ChatMessage(role="assistant", content=_text(self.content), tool_calls=calls)


class ToolMessageParam(_Message):
    role: Literal["tool"]
    tool_call_id: str = Field(min_length=1, description="The id of the call this result answers.")

    def to_schema(self) -> ChatMessage:
        return ChatMessage(role="tool", content=_text(self.content), tool_call_id=self.tool_call_id)


# One model per role, as in OpenAI's API (the role picks it). Named *Param like OpenAI's, apart from the
# response models of streams.edge.openapi (one OpenAPI document holds both).
ClientMessage = Annotated[SystemMessageParam | UserMessageParam | AssistantMessageParam | ToolMessageParam,
                          Field(discriminator="role")]


class StreamOptions(_Strict):
    include_usage: StrictBool = Field(default=False, description="Send a last chunk with the usage and no choices.")


def _unsupported_value(message: str, param: str) -> errors.EdgeError:
    return errors.EdgeError(400, message, param=param, code="unsupported_value")


def _invalid_value(message: str, param: str) -> errors.EdgeError:
    return errors.EdgeError(400, message, param=param, code="invalid_value")


class Body(_Strict):
    """Sampling fields shared by every API, and what the pipeline asks of each body."""

    api: ClassVar[str]  # the API's name in access logs
    unsupported: ClassVar[frozenset[str]]  # the OpenAI parameters of streams.wire.unsupported it knows

    model: str = Field(min_length=1, description="A served model (GET /v1/models).")
    max_tokens: StrictInt | None = Field(
        default=None, ge=1, le=32768,
        description="Most tokens to generate; prompt + max_tokens must fit the model's context. "
        "Default: edge.max_tokens_default, capped to what the context leaves.")
    temperature: StrictFloat | None = Field(default=None, ge=0.0, le=2.0, description="0 (the default) is greedy.")
    top_p: StrictFloat | None = Field(default=None, gt=0.0, le=1.0, description="Nucleus sampling mass.")
    top_k: StrictInt | None = Field(default=None, ge=0, description="Extension: keep the k most likely tokens; 0: off.")
    seed: StrictInt | None = Field(default=None, ge=0, le=2**63 - 1,
                                   description="Same seed, same parameters: same text. Default: a random seed.")
    stop: str | Annotated[list[str], Field(max_length=8)] | None = Field(
        default=None, description="Up to 8 strings that end generation; they are not returned.")
    n: StrictInt | None = Field(
        default=None, ge=1, le=8, description="Choices to generate (1..8), each its own sequence; choice i samples "
        "with seed + i, so a regeneration is the same. Not yet with stream: true.")
    frequency_penalty: StrictFloat | None = Field(
        default=None, ge=-2.0, le=2.0, description="Times a token's count in the answer so far, off its logit.")
    presence_penalty: StrictFloat | None = Field(
        default=None, ge=-2.0, le=2.0, description="Off the logit of every token already in the answer.")
    logit_bias: dict[str, StrictFloat] | None = Field(
        default=None, max_length=300, description="Token id (as a string) -> bias in [-100, 100] added to its logit.")
    # vLLM's sampling extensions, under vLLM's names.
    repetition_penalty: StrictFloat | None = Field(
        default=None, gt=0.0, le=10.0, description="Extension (vLLM): > 1 discourages tokens of the prompt and answer.")
    min_p: StrictFloat | None = Field(
        default=None, ge=0.0, le=1.0, description="Extension (vLLM): drop tokens below min_p x the top probability.")
    stop_token_ids: Annotated[list[StrictInt], Field(max_length=64)] | None = Field(
        default=None, description="Extension (vLLM): token ids that end generation (not in the text).")
    min_tokens: StrictInt | None = Field(
        default=None, ge=0, le=32768, description="Extension (vLLM): no EOS or stop token before this many tokens.")
    ignore_eos: StrictBool | None = Field(default=None, description="Extension (vLLM): generate past EOS.")
    user: str | None = Field(default=None, description="End-user id; accepted and ignored.")
    stream: StrictBool | None = Field(default=None, description="Stream chunks as Server-Sent Events.")
    stream_options: StreamOptions | None = None
    # Extensions (not in OpenAI's API).
    speculation: StrictBool | None = Field(
        default=None, description="Extension: false turns speculative decoding off for this request.")
    priority: StrictInt | None = Field(default=None, ge=-10, le=10, description="Extension: lower runs first.")

    @model_validator(mode="after")
    def _neutral_only(self) -> Body:
        if self.choices > 1 and self.streams:
            raise _unsupported_value("n > 1 is not supported when streaming (stream: true, the websocket) yet.", "n")
        self.token_bias()  # a 400 naming logit_bias when a key or a bias is out of range
        if any(t < 0 for t in self.stop_token_ids or []):
            raise _invalid_value("stop_token_ids holds token ids, which are >= 0.", "stop_token_ids")
        limit = self.max_new_tokens()
        if self.min_tokens and limit is not None and self.min_tokens > limit:
            raise _invalid_value(f"min_tokens ({self.min_tokens}) must not exceed max_tokens ({limit}).",
                                 "min_tokens")
        return self

    def token_bias(self) -> dict[int, float]:
        """logit_bias with integer keys (OpenAI's shape has string keys)."""
        out: dict[int, float] = {}
        for key, bias in (self.logit_bias or {}).items():
            if not key.isdigit():
                raise _invalid_value(f"logit_bias keys are token ids (digits), got {key!r}.", "logit_bias")
            if not -100.0 <= bias <= 100.0:
                raise _invalid_value(f"logit_bias[{key}] is {bias}; biases are in [-100, 100].", "logit_bias")
            out[int(key)] = float(bias)
        return out

    @property
    def choices(self) -> int:
        """How many choices the client asked for (n)."""
        return self.n or 1

    def max_new_tokens(self) -> int | None:
        """The client's max_tokens; None: the edge's default, capped to what the context leaves."""
        return self.max_tokens

    def wanted_logprobs(self) -> int | None:
        """How many top tokens to report with each token's logprob; None: no logprobs."""
        return None

    def echoes(self) -> bool:
        """Whether the answer starts with the prompt (completions' echo); with logprobs, the prompt's come too."""
        return False

    def wire_tools(self) -> list[ToolSpec] | None:
        """The functions the model is offered (rendered into its prompt); None: no tools."""
        return None

    def conversation_key(self) -> str | None:
        """The conversation the body names (canary routing sticks to it); None: none named."""
        return None

    def file_search(self) -> FileSearchTool | None:
        """The file_search tool, when the request is to be grounded by the retriever."""
        return None

    def constraint(self) -> OutputConstraint | None:
        """What constrained decoding must make the output match; None: free text."""
        return None

    def chat_input(self) -> list[ChatMessage] | None:
        """The conversation, for the model's chat template; None: a raw prompt (:meth:`prompt_input`)."""
        return None

    def prompt_input(self) -> str | None:
        return None

    def prompt_tokens_input(self) -> list[int] | None:
        """A raw prompt given as token ids (completions), fed to the model as they are; None: not given so."""
        return None

    @property
    def input_param(self) -> str:
        """The prompt's field in this API, named by errors about the prompt."""
        raise NotImplementedError

    @property
    def streams(self) -> bool:
        return bool(self.stream)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class _Chat(Body):
    """The chat fields other than ``messages``, shared by the chat API and the websocket."""

    max_completion_tokens: StrictInt | None = Field(default=None, ge=1, le=32768, description="Alias of max_tokens.")
    prompt_cache_key: str | None = Field(
        default=None, min_length=1, max_length=128,
        description="OpenAI's cache/routing hint, which agents set per conversation: during a canary rollout every "
        "request with the same key goes to the same pool (as X-Conversation-Id does, which wins).")
    tools: list[Tool] | None = Field(default=None, max_length=MAX_TOOLS,
                                     description=f"Functions the model may call (at most {MAX_TOOLS}).")
    tool_choice: ToolChoice | None = Field(
        default=None, description="none, auto (the default with tools), required, or one named function (called once).")
    parallel_tool_calls: StrictBool | None = Field(default=None, description="Allow several calls in one answer.")
    response_format: ResponseFormat | None = Field(
        default=None, description="text, json_object or json_schema; JSON is enforced by constrained decoding.")
    logprobs: StrictBool | None = Field(
        default=None, description="Return each answer token's log-probability (the model's raw log_softmax).")
    top_logprobs: StrictInt | None = Field(
        default=None, ge=0, le=20, description="With logprobs: this many most likely tokens at each position.")

    def max_new_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    @model_validator(mode="after")
    def _logprobs(self) -> _Chat:
        if self.top_logprobs and not self.logprobs:
            raise _invalid_value("top_logprobs needs logprobs: true.", "top_logprobs")
        if self.logprobs and self.tools:
            raise _unsupported_value("logprobs are not supported together with tools.", "logprobs")
        return self

    def wanted_logprobs(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    @model_validator(mode="after")
    def _one_max_tokens(self) -> _Chat:
        if None not in (self.max_tokens, self.max_completion_tokens) and self.max_tokens != self.max_completion_tokens:
            raise _invalid_value(f"max_tokens ({self.max_tokens}) and max_completion_tokens "
                                 f"({self.max_completion_tokens}) differ; give one of them.", "max_completion_tokens")
        return self

    def wire_tools(self) -> list[ToolSpec] | None:
        return wire_tools(self.tools, self.tool_choice)

    def conversation_key(self) -> str | None:
        return self.prompt_cache_key

    def file_search(self) -> FileSearchTool | None:
        return file_search(self.tools)

    def constraint(self) -> OutputConstraint | None:
        return output_constraint(self.wire_tools(), self.tool_choice, self.parallel_tool_calls, self.response_format)


class ChatCompletionBody(_Chat):
    api: ClassVar[str] = "chat"
    unsupported: ClassVar[frozenset[str]] = FOR_CHAT

    messages: list[ClientMessage] = Field(min_length=1, description="The conversation so far.")

    def chat_input(self) -> list[ChatMessage] | None:
        return [m.to_schema() for m in self.messages]

    @property
    def input_param(self) -> str:
        return "messages"



class CompletionBody(Body):
    api: ClassVar[str] = "completions"
    unsupported: ClassVar[frozenset[str]] = FOR_COMPLETIONS

    prompt: (Annotated[str, Field(min_length=1)]
             | Annotated[list[Annotated[str, Field(min_length=1)]], Field(min_length=1, max_length=1)]
             | TokenIds | Annotated[list[TokenIds], Field(min_length=1, max_length=1)]) = Field(
        description="The prompt: a non-empty string, or its token ids (a list of integers, fed to the model as they "
        "are, as OpenAI and vLLM take them); or a list holding exactly one of either.")
    max_tokens: StrictInt | None = Field(
        default=None, ge=0, le=32768,
        description="Most tokens to generate; prompt + max_tokens must fit the model's context; 0 only with echo "
        "(the prompt scored, nothing generated). Default: edge.max_tokens_default, capped to what the context leaves.")
    echo: StrictBool | None = Field(
        default=None, description="Answer with the prompt before the completion; with logprobs, the prompt tokens' "
        "logprobs come first (the first one null), as lm-evaluation-harness's loglikelihood asks. Not with n > 1.")
    logprobs: StrictInt | None = Field(
        default=None, ge=0, le=20, description="Return each token's log-probability (the model's raw log_softmax) "
        "and this many most likely tokens at its position (OpenAI allows up to 5, vLLM 20).")

    @field_validator("prompt", mode="before")
    @classmethod
    def _prompt_shape(cls, value: Any) -> Any:
        def ids(items: Any) -> bool:
            return isinstance(items, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in items)

        if not isinstance(value, list):
            return value
        if not (all(isinstance(p, str) for p in value) or ids(value) or all(ids(p) for p in value)):
            raise _invalid_value("'prompt' is a string, a list of token ids (integers), or a list holding one of "
                                 "either.", "prompt")
        if len(value) > 1 and not ids(value):
            raise _unsupported_value("Exactly one prompt per request is supported.", "prompt")
        tokens = value if ids(value) else value[0] if ids(value[0]) else []
        if any(t < 0 for t in tokens):
            raise _invalid_value("A prompt of token ids holds token ids, which are >= 0.", "prompt")
        return value

    @model_validator(mode="after")
    def _echo_rules(self) -> CompletionBody:
        if self.echo and self.choices > 1:
            raise _unsupported_value("echo is not supported with n > 1.", "echo")
        if self.max_tokens == 0 and not self.echo:
            raise _invalid_value("max_tokens must be at least 1 (0 only with echo: true).", "max_tokens")
        return self

    def wanted_logprobs(self) -> int | None:
        return self.logprobs

    def echoes(self) -> bool:
        return bool(self.echo)

    def _the_prompt(self) -> str | list[int]:
        one = self.prompt[0] if isinstance(self.prompt, list) else self.prompt
        return self.prompt if isinstance(one, int) else one  # type: ignore[return-value]

    def prompt_input(self) -> str | None:
        prompt = self._the_prompt()
        return prompt if isinstance(prompt, str) else None

    def prompt_tokens_input(self) -> list[int] | None:
        prompt = self._the_prompt()
        return None if isinstance(prompt, str) else prompt

    @property
    def input_param(self) -> str:
        return "prompt"



class WsRequestBody(_Chat):
    """A websocket request frame: the chat fields (or a raw ``prompt``) plus an optional client ``id``."""

    api: ClassVar[str] = "ws"
    unsupported: ClassVar[frozenset[str]] = FOR_CHAT

    id: str | StrictInt | None = None
    type: Literal["request"] | None = None
    messages: list[ClientMessage] | None = Field(default=None, min_length=1)
    prompt: str | None = None

    @model_validator(mode="after")
    def _one_input(self) -> WsRequestBody:
        if (self.messages is None) == (self.prompt is None):
            raise errors.EdgeError(400, "Give exactly one of 'messages' and 'prompt'.", param="messages",
                                   code="invalid_value")
        if self.prompt is not None and self.tools:
            raise errors.EdgeError(400, "'tools' need 'messages' (a raw prompt has no chat template to render them).",
                                   param="tools", code="invalid_value")
        return self

    def chat_input(self) -> list[ChatMessage] | None:
        return None if self.messages is None else [m.to_schema() for m in self.messages]

    def prompt_input(self) -> str | None:
        return self.prompt

    @property
    def input_param(self) -> str:
        return "prompt" if self.messages is None else "messages"

    @property
    def streams(self) -> bool:
        return True  # a websocket always streams; ``stream`` is accepted so a chat body can be sent unchanged
