"""What a chat request holds besides its sampling: messages, the calls they made, the tools offered, and the
constraint on the output. Parts of the bus events (schemas.events)."""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class ToolCall(BaseModel):
    """A call an assistant message made (OpenAI's `tool_calls[i]`, flattened)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(min_length=1, description="The call's id; a `tool` message answers it by this id.")
    name: str = Field(min_length=1, description="The function called.")
    arguments: str = Field(description="Its arguments, as JSON text.")


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    role: Literal["system", "user", "assistant", "tool"] = Field(description="Author of the message.")
    content: str = Field(description="Text of the message.")
    tool_calls: list[ToolCall] | None = Field(default=None, description="An assistant message's tool calls.")
    tool_call_id: str | None = Field(default=None, description="A tool message: the call it answers.")


class ToolSpec(BaseModel):
    """A function the model may call (OpenAI's `tools[i].function`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, max_length=64, description="The function's name.")
    description: str | None = Field(default=None, description="What it does, for the model.")
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}},
                                       description="JSON schema of its arguments.")


class OutputConstraint(BaseModel):
    """What the output must be, enforced token by token by constrained decoding."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["json", "tool_calls"] = Field(description="json: one JSON value; tool_calls: Hermes <tool_call> blocks.")
    json_schema: dict[str, Any] | None = Field(default=None, description="kind json: the value's schema; None: any object.")
    tool_choice: str = Field(default="auto", description="kind tool_calls: auto, required, or the one function's name.")
    parallel_tool_calls: bool = Field(default=True, description="kind tool_calls: more than one call allowed.")
