"""The body of a finished request's answer, in OpenAI's shape: a ``chat.completion`` or a ``text_completion``.

The edge answers it (with its ``specstream`` extras, :mod:`streams.edge.openai_api`), and a batch's output file
holds it as each line's response body (:mod:`streams.batch.outputs`): one definition, so both say the same.
"""
from __future__ import annotations

import time
from typing import Any

from schemas.events import Completion, GenerateRequest
from schemas.retrieval import Retrieved
from streams.rag.grounding import citations
from streams.wire.logprobs import chat_logprobs, text_logprobs
from streams.wire.tool_calls import calls_tools, finish_reason, parse_message


def completion_body(gen: GenerateRequest, final: Completion, *, chat: bool,
                    retrieved: Retrieved | None = None) -> dict[str, Any]:
    """OpenAI's chat.completion / text_completion object of a finished request."""
    logprobs = chat_logprobs(final.logprobs) if chat else text_logprobs(final, gen.echo)
    choice: dict[str, Any] = {"index": 0, "finish_reason": final.finish_reason, "logprobs": logprobs}
    if chat and calls_tools(gen):
        content, calls = parse_message(final.text, gen.request_id)
        choice["message"] = {"role": "assistant", "content": content, **({"tool_calls": calls} if calls else {})}
        choice["finish_reason"] = finish_reason(final.finish_reason, calls, answered_calls(final))
    elif chat:
        choice["message"] = {"role": "assistant", "content": final.text}
        if retrieved is not None:
            choice["message"]["annotations"] = citations(final.text, retrieved.passages)
    else:
        choice["text"] = (gen.prompt or "") + final.text if gen.echo else final.text
    return {
        "id": gen.request_id,
        "object": "chat.completion" if chat else "text_completion",
        "created": int(gen.created_at or time.time()),
        "model": gen.model,
        "choices": [choice],
        "usage": final.usage.model_dump(),
        "system_fingerprint": None,
    }


def answered_calls(final: Completion) -> set[str]:
    """The ids of the calls the worker ran itself (server-side tools): not calls the client must answer."""
    return {r.call_id for r in final.tool_results}
