"""The edge: OpenAI-compatible HTTP and websocket front end that publishes requests to Kafka and relays replies.

See :mod:`streams.edge.app` for the routes and :mod:`streams.edge.replies` for
how each edge receives only its own replies.
"""
from streams.edge.app import create_app, run_edge
from streams.edge.settings import EdgeOptions

__all__ = ["EdgeOptions", "create_app", "run_edge"]
