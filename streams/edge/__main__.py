"""``python -m streams.edge [--host H] [--port P] [--edge-id ID] [--bootstrap B] [--prefix P] [--model M ...]``.

A stand-alone entry point; the project CLI (``specstream edge``) is the usual way in. The options override the
project settings (:func:`streams.config.load_settings`: the YAML file and the environment).
"""
from __future__ import annotations

import argparse
import logging
from typing import Any

from streams.config import load_settings
from streams.edge.app import run_edge
from streams.edge.settings import EdgeOptions

# option -> (settings section, key)
_SETTINGS = {"host": ("edge", "host"), "port": ("edge", "port"), "edge_id": ("edge", "edge_id"),
             "bootstrap_servers": ("kafka", "bootstrap_servers"), "topic_prefix": ("kafka", "topic_prefix"),
             "request_timeout_s": ("edge", "request_timeout_s")}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m streams.edge", description=__doc__.splitlines()[0])
    parser.add_argument("--host")
    parser.add_argument("--port", type=int)
    parser.add_argument("--edge-id")
    parser.add_argument("--bootstrap", dest="bootstrap_servers")
    parser.add_argument("--prefix", dest="topic_prefix")
    parser.add_argument("--model", dest="models", action="append", default=[])
    parser.add_argument("--request-timeout", dest="request_timeout_s", type=float)
    args = vars(parser.parse_args(argv))
    sections: dict[str, dict[str, Any]] = {}
    for option, (section, key) in _SETTINGS.items():
        if args[option] is not None:
            sections.setdefault(section, {})[key] = args[option]
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    run_edge(EdgeOptions(load_settings(**sections), models=tuple(args["models"])))


if __name__ == "__main__":
    main()
