"""The answer of a finished request, in OpenAI's shape: a ``chat.completion`` or a ``text_completion``
(:mod:`streams.wire.completion_models`).

The edge answers it (with its ``specstream`` extras, :mod:`streams.edge.openai_api`), and a batch's output file
holds it as each line's response body (:mod:`streams.batch.outputs`): one definition, so both say the same.
"""
from __future__ import annotations

import time
from typing import Any

from schemas.events import Completion, GenerateRequest
from schemas.retrieval import Retrieved
from streams.rag.grounding import citations
from streams.wire.completion_models import (
    AssistantMessage,
    ChatChoice,
    ChatCompletion,
    GroundedAssistantMessage,
    TextChoice,
    TextCompletion,
)
from streams.wire.logprobs import chat_logprobs, text_logprobs
from streams.wire.tool_calls import calls_tools, finish_reason, parse_message


def completion(gen: GenerateRequest, final: Completion, *, chat: bool,
               retrieved: Retrieved | None = None) -> ChatCompletion | TextCompletion:
    """OpenAI's chat.completion / text_completion object of a finished request (without the edge's extras)."""
    created = int(gen.created_at or time.time())
    if not chat:
        text = (gen.prompt or "") + final.text if gen.echo else final.text
        choice = TextChoice(index=0, finish_reason=final.finish_reason, logprobs=text_logprobs(final, gen.echo),
                            text=text)
        return TextCompletion(id=gen.request_id, object="text_completion", created=created, model=gen.model,
                              choices=[choice], usage=final.usage, system_fingerprint=None)
    reason: str = final.finish_reason
    message: AssistantMessage
    if calls_tools(gen):
        content, calls = parse_message(final.text, gen.request_id)
        message = AssistantMessage(role="assistant", content=content, tool_calls=calls or None)
        reason = finish_reason(final.finish_reason, calls, answered_calls(final))
    elif retrieved is not None:
        message = GroundedAssistantMessage(role="assistant", content=final.text,
                                           annotations=citations(final.text, retrieved.passages))
    else:
        message = AssistantMessage(role="assistant", content=final.text)
    chat_choice = ChatChoice(index=0, finish_reason=reason, logprobs=chat_logprobs(final.logprobs), message=message)
    return ChatCompletion(id=gen.request_id, object="chat.completion", created=created, model=gen.model,
                          choices=[chat_choice], usage=final.usage, system_fingerprint=None)


def completion_body(gen: GenerateRequest, final: Completion, *, chat: bool,
                    retrieved: Retrieved | None = None) -> dict[str, Any]:
    """The JSON object of :func:`completion` (a batch output line's body)."""
    return completion(gen, final, chat=chat, retrieved=retrieved).model_dump()


def answered_calls(final: Completion) -> set[str]:
    """The ids of the calls the worker ran itself (server-side tools): not calls the client must answer."""
    return {r.call_id for r in final.tool_results}
