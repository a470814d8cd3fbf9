"""``python -m streams.edge [--host H] [--port P] [--edge-id ID] [--bootstrap B] [--prefix P] [--model M ...]``.

A stand-alone entry point; the project CLI (``specstream edge``) is the usual way in.
"""
from __future__ import annotations

import argparse
import logging

from streams.edge.app import run_edge
from streams.edge.settings import EdgeOptions


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m streams.edge", description=__doc__.splitlines()[0])
    parser.add_argument("--host")
    parser.add_argument("--port", type=int)
    parser.add_argument("--edge-id")
    parser.add_argument("--bootstrap", dest="bootstrap_servers")
    parser.add_argument("--prefix", dest="topic_prefix")
    parser.add_argument("--model", dest="models", action="append")
    parser.add_argument("--request-timeout", dest="request_timeout_s", type=float)
    args = parser.parse_args(argv)
    overrides = {k: v for k, v in vars(args).items() if v is not None}
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    run_edge(EdgeOptions(**overrides))


if __name__ == "__main__":
    main()
