"""``n`` choices: each its own request on the bus (its own sequence), seeded seed + i, merged into one answer.

Choice 0 is the admitted request itself; choice i > 0 is a copy with request id ``<id>-<i>`` and seed + i (mod
2^63), so regenerating with the same seed gives the same choices. Usage counts the prompt once and sums the
completions, as OpenAI's does (its cached tokens are the first choice's).
"""
from __future__ import annotations

from typing import Any

from schemas.events import Completion, GenerateRequest, Usage

_SEEDS = 2**63


def choice_requests(request: GenerateRequest, n: int) -> list[GenerateRequest]:
    """The n wire requests of one client request (choice 0 is the request itself)."""
    seed = request.sampling.seed or 0
    return [request] + [
        request.model_copy(update={
            "request_id": f"{request.request_id}-{i}",
            "sampling": request.sampling.model_copy(update={"seed": (seed + i) % _SEEDS}),
        })
        for i in range(1, n)
    ]


def merged_usage(finals: list[Completion]) -> Usage:
    prompt = finals[0].usage.prompt_tokens
    completion = sum(f.usage.completion_tokens for f in finals)
    return Usage(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion,
                 prompt_tokens_details=finals[0].usage.prompt_tokens_details)


def merged_body(bodies: list[dict[str, Any]], finals: list[Completion]) -> dict[str, Any]:
    """One response of the n per-choice response bodies: their choices, indexed 0..n-1, and the merged usage."""
    out = dict(bodies[0])
    out["choices"] = [{**body["choices"][0], "index": i} for i, body in enumerate(bodies)]
    out["usage"] = merged_usage(finals).model_dump()
    return out


def for_ticket(finals: list[Completion]) -> Completion:
    """What the ticket charges: the first choice's answer with every choice's tokens."""
    usage = finals[0].usage
    charged = sum(f.usage.prompt_tokens + f.usage.completion_tokens for f in finals)
    return finals[0].model_copy(update={"usage": Usage(prompt_tokens=usage.prompt_tokens,
                                                       completion_tokens=charged - usage.prompt_tokens,
                                                       total_tokens=charged)})
