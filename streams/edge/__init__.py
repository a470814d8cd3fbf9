"""The edge: OpenAI-compatible HTTP and websocket front end that publishes requests to Kafka and relays replies.

See :mod:`streams.edge.app` for the routes and :mod:`streams.edge.replies` for
how each edge receives only its own replies.

The package's names are loaded on first use, so that light modules
(``streams.edge.keys``, which ``specstream keys`` uses) import without the web stack.
"""
from __future__ import annotations

from typing import Any

__all__ = ["EdgeOptions", "create_app", "run_edge"]


def __getattr__(name: str) -> Any:
    if name in ("create_app", "run_edge"):
        from streams.edge import app

        return getattr(app, name)
    if name == "EdgeOptions":
        from streams.edge.settings import EdgeOptions

        return EdgeOptions
    raise AttributeError(f"module 'streams.edge' has no attribute {name!r}")
