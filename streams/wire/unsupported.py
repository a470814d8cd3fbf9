"""OpenAI parameters the engine does not implement: refused by name, unless they carry their neutral value.

``functions: [...]`` is 400 ``unsupported_parameter`` naming ``functions`` (rather than
the ``unknown_parameter`` a typo gets), while ``functions: []``, ``store: false``, ...
change nothing and are dropped. Hints that change nothing about the answer (caching, end-user
identification) are accepted with any value and ignored. Supporting one of
these is removing it here and adding the field to the API's body
(:mod:`streams.wire.bodies`).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from streams.wire import errors


def _empty(value: Any) -> bool:
    return value in (None, [], {}, "")


def _any(value: Any) -> bool:
    return True


# name -> (what it is, is this value neutral?)
_UNSUPPORTED: dict[str, tuple[str, Callable[[Any], bool]]] = {
    "functions": ("function calling", _empty),
    "function_call": ("function calling", lambda v: v in (None, "none")),
    "audio": ("audio output", _empty),
    "modalities": ("other output modalities", lambda v: v is None or v == ["text"]),
    "prediction": ("predicted outputs", _empty),
    "reasoning_effort": ("reasoning models", lambda v: v is None),
    "web_search_options": ("web search", _empty),
    "store": ("stored completions", lambda v: v in (None, False)),
    "metadata": ("stored completions", _empty),
    "service_tier": ("service tiers", lambda v: v in (None, "auto", "default")),
    "verbosity": ("verbosity control", lambda v: v is None),
    "moderation": ("moderation", lambda v: v is None),
    "safety_identifier": ("end-user identification", _any),
    "prompt_cache_retention": ("prompt caching hints", _any),
    "prompt_cache_options": ("prompt caching hints", _any),
    "best_of": ("best-of sampling", lambda v: v in (None, 1)),
    "suffix": ("insertion (suffix)", lambda v: v in (None, "")),
}
# Which API has which (OpenAI's completions API has no tools, its chat API no best_of): in a body of the other API
# the name is an unknown parameter.
FOR_COMPLETIONS: frozenset[str] = frozenset({"best_of", "suffix"})
FOR_CHAT: frozenset[str] = frozenset(_UNSUPPORTED) - {"best_of", "suffix"}


def strip_unsupported(data: dict[str, Any], known: frozenset[str]) -> dict[str, Any]:
    """``data`` without the neutral ones among the ``known`` unsupported parameters; 400 for any other value."""
    out = dict(data)
    for name in [n for n in data if n in known]:
        what, neutral = _UNSUPPORTED[name]
        if not neutral(data[name]):
            raise errors.EdgeError(
                400, f"'{name}' is not supported by this server ({what}); remove it from the request.",
                param=name, code="unsupported_parameter",
            )
        del out[name]
    return out
