"""Grounded prompts and their citations.

The prompt: the passages numbered [1], [2], ... (best first) in a system message, with the instruction to answer
from them only and cite them by number; the conversation follows unchanged. A passage's text goes into the prompt
verbatim, so an answer that quotes it is what the engine's prompt-lookup speculation drafts well.

The citations (the rule, deterministic): every passage the model was given is cited, once, in prompt order, as
OpenAI's ``file_citation`` annotation carrying the file, the chunk's character span in the file's extracted text
and the quote (the chunk's text). Its ``index`` (position in the answer) is where the model wrote that passage's
marker ``[n]``, when it did, else the end of the answer. A small model rarely writes the markers, so the citations
do not depend on it: what grounded the answer is what it was given.
"""
from __future__ import annotations

import re
from typing import Any

from schemas.events import ChatMessage, GenerateRequest
from schemas.retrieval import Passage

INSTRUCTION = ("Answer the question using only the numbered passages below. Quote their words where you can and "
               "cite each passage you use by its number in brackets, like [1]. If the passages do not hold the "
               "answer, say that you do not know.")


def passages_block(passages: list[Passage], max_chars: int) -> tuple[str, list[Passage]]:
    """The numbered passages, as many as fit in max_chars (the first always, cut if it must be), and those used."""
    parts: list[str] = []
    used: list[Passage] = []
    size = 0
    for number, passage in enumerate(passages, start=1):
        entry = f"[{number}] ({passage.filename}) {passage.text.strip()}"
        if used and size + len(entry) > max_chars:
            break
        parts.append(entry[:max_chars])
        used.append(passage)
        size += len(entry) + 2
    return "\n\n".join(parts), used


def ground(request: GenerateRequest, passages: list[Passage], *, max_chars: int) -> tuple[GenerateRequest, list[Passage]]:
    """The request with the passages and the instruction in front of its conversation, and the passages used."""
    block, used = passages_block(passages, max_chars)
    context = f"{INSTRUCTION}\n\n{block}" if used else "No passages were found for this question. Say so."
    messages = list(request.messages or [])
    if messages and messages[0].role == "system":
        messages[0] = messages[0].model_copy(update={"content": f"{messages[0].content}\n\n{context}"})
    else:
        messages.insert(0, ChatMessage(role="system", content=context))
    return request.model_copy(update={"messages": messages}), used


def question_of(request: GenerateRequest) -> str:
    """What to search for: the last user message."""
    for message in reversed(request.messages or []):
        if message.role == "user" and message.content.strip():
            return message.content
    return request.prompt or ""


def citations(answer: str, passages: list[Passage]) -> list[dict[str, Any]]:
    """OpenAI file_citation annotations for the passages the answer was grounded on (the rule: module docstring)."""
    annotations: list[dict[str, Any]] = []
    for number, passage in enumerate(passages, start=1):
        marker = re.search(rf"\[{number}\]", answer)
        annotations.append({
            "type": "file_citation",
            "index": marker.end() if marker else len(answer),
            "file_id": passage.file_id,
            "filename": passage.filename,
            "quote": passage.text,
            "char_start": passage.char_start,
            "char_end": passage.char_end,
            "vector_store_id": passage.vector_store_id,
            "score": passage.score,
        })
    return annotations
