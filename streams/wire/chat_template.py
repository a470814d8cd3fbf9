"""A chat request as the model reads it: its messages and tools through the chat template, then tokens.

The worker renders every prompt with it, and the edge counts a prompt's tokens with it (the validate stage), so
both agree on the context length a request takes.

A model whose chat template has a tool section (it mentions `tools`) renders the tools itself.
SmolLM2-135M's has none (it was not trained for tools), so we render them with our own template,
the Hermes-style one the larger SmolLM2 and Qwen2.5 models were trained on: a system section listing
the functions as JSON inside <tools></tools>, calls as <tool_call>{json}</tool_call> blocks in the
assistant's turn, results as <tool_response> blocks in a `tool` turn. Constrained decoding then
produces exactly that call format (engine.grammar.constraint; :mod:`streams.worker.intake` compiles it).
"""
from __future__ import annotations

import json
from typing import Any

from engine.grammar.constraint import TOOL_CALL_CLOSE, TOOL_CALL_OPEN
from schemas.events import ChatMessage, GenerateRequest, ToolCall, ToolSpec

TOOLS_SYSTEM_PROMPT = (
    "You are a function calling AI model. You are provided with function signatures within <tools></tools> "
    "XML tags. You may call one or more functions to assist with the user query. Don't make assumptions about "
    "what values to plug into functions. Here are the available tools: <tools>\n{tools}\n</tools>\n"
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n{{\"name\": <function-name>, \"arguments\": "
    "<args-json-object>}}\n</tool_call>"
)


def prompt_token_ids(request: GenerateRequest, tokenizer: Any) -> list[int]:
    """Chat messages go through the model's chat template; a raw prompt is tokenized as is; a prompt given as
    token ids is those ids (the engine refuses ids outside its vocabulary)."""
    if request.prompt_token_ids is not None:
        return list(request.prompt_token_ids)
    if request.messages is not None:
        if not getattr(tokenizer, "chat_template", None):  # a base model: never another model's template
            raise ValueError("this model has no chat template (a base model): send a raw prompt to /v1/completions")
        messages, template_kwargs = template_messages(request, tokenizer)
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **template_kwargs)
        # The template already contains the special tokens the model expects.
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    else:
        ids = tokenizer(request.prompt)["input_ids"]
    return list(ids)


def template_messages(request: GenerateRequest, tokenizer: Any) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The conversation for `apply_chat_template`, and the keyword arguments it needs (`tools`, for a model
    whose template renders them)."""
    messages = request.messages or []
    if "tools" in (getattr(tokenizer, "chat_template", None) or ""):
        tools = [{"type": "function", "function": t.model_dump(exclude_none=True)} for t in request.tools or []]
        return [_openai_message(m) for m in messages], ({"tools": tools} if tools else {})
    turns = [{"role": m.role, "content": _hermes_content(m)} for m in messages]
    return (_with_tool_section(turns, request.tools) if request.tools else turns), {}


def format_call(call: ToolCall) -> str:
    """One call in the Hermes format the model produces (arguments compact, as the grammar writes them)."""
    body = json.dumps({"name": call.name, "arguments": _loads_or_text(call.arguments)}, ensure_ascii=False)
    return f"{TOOL_CALL_OPEN}\n{body}\n{TOOL_CALL_CLOSE}"


def _hermes_content(m: ChatMessage) -> str:
    """A turn's text in the Hermes format: calls after the assistant's text, results wrapped."""
    if m.role == "assistant" and m.tool_calls:
        return "\n".join([m.content] * bool(m.content) + [format_call(c) for c in m.tool_calls])
    if m.role == "tool":
        return f"<tool_response>\n{m.content}\n</tool_response>"
    return m.content


def _with_tool_section(turns: list[dict[str, Any]], tools: list[ToolSpec]) -> list[dict[str, Any]]:
    """The tool listing appended to the system turn (or as a system turn of its own)."""
    listing = "\n".join(json.dumps({"type": "function", "function": t.model_dump(exclude_none=True)},
                                   separators=(",", ":")) for t in tools)
    section = TOOLS_SYSTEM_PROMPT.format(tools=listing)
    if turns and turns[0]["role"] == "system":
        first = turns[0]["content"]
        return [{"role": "system", "content": f"{first}\n\n{section}" if first else section}, *turns[1:]]
    return [{"role": "system", "content": section}, *turns]


def _openai_message(m: ChatMessage) -> dict[str, Any]:
    """A message as OpenAI (and Hugging Face tool templates) write it."""
    out: dict[str, Any] = {"role": m.role, "content": m.content}
    if m.tool_calls:
        out["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": _loads_or_text(c.arguments)}}
            for c in m.tool_calls
        ]
    if m.tool_call_id is not None:
        out["tool_call_id"] = m.tool_call_id
    return out


def _loads_or_text(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text
