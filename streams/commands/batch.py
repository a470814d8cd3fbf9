"""``specstream batch``: offline batch jobs through a running edge (OpenAI's Batch API), and the assembler.

    specstream batch submit FILE.jsonl [--wait]    upload the file (purpose=batch), create the batch
    specstream batch status|cancel BATCH_ID         its state (cancel: stop taking new lines)
    specstream batch list [--limit N]               the newest batches
    specstream batch download BATCH_ID [--out DIR]  its output and error files
    specstream batch assembler                      run the consumer that writes batches' files (`up` starts one)
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from streams.commands.common import describe, say
from streams.config import Settings

_TERMINAL = ("completed", "failed", "expired", "cancelled")


def add_commands(commands: Any) -> None:
    batch = commands.add_parser("batch", help="offline batch jobs (OpenAI's Batch API) on a running edge")
    sub = batch.add_subparsers(dest="batch_command", required=True, metavar="ACTION")
    submit = sub.add_parser("submit", help="upload a JSONL file and create a batch of its lines")
    submit.add_argument("file", type=Path)
    submit.add_argument("--wait", action="store_true", help="follow it to its end with a progress bar")
    submit.add_argument("--endpoint", default=None, help="default: the url of the file's first line")
    submit.set_defaults(handler=_client_command(_submit))
    for name, helptext in (("status", "a batch's state"), ("cancel", "cancel a batch (what finished is kept)")):
        cmd = sub.add_parser(name, help=helptext)
        cmd.add_argument("batch_id")
        cmd.set_defaults(handler=_client_command(_status if name == "status" else _cancel))
    listing = sub.add_parser("list", help="the newest batches")
    listing.add_argument("--limit", type=int, default=20)
    listing.set_defaults(handler=_client_command(_list))
    download = sub.add_parser("download", help="write a batch's output and error files")
    download.add_argument("batch_id")
    download.add_argument("--out", type=Path, default=Path("."), help="folder (default: here)")
    download.set_defaults(handler=_client_command(_download))
    sub.add_parser("assembler", help="run the batch assembler (a consumer of <prefix>.batch-results)").set_defaults(
        handler=cmd_assembler)
    for parser in (submit, *[sub.choices[n] for n in ("status", "cancel", "list", "download")]):
        parser.add_argument("--base-url", default=None, help="edge URL (default: from the config's edge host and port)")
        parser.add_argument("--api-key", default=None, help="default: $SPECSTREAM_API_KEY, else $OPENAI_API_KEY")


def _client_command(action: Any) -> Any:
    def handler(args: argparse.Namespace, settings: Settings) -> int:
        import httpx

        base = args.base_url or f"http://{settings.edge.host}:{settings.edge.port}"
        key = args.api_key or os.environ.get("SPECSTREAM_API_KEY") or os.environ.get("OPENAI_API_KEY") or ""
        with httpx.Client(base_url=base.rstrip("/"), headers={"Authorization": f"Bearer {key}"}, timeout=60) as client:
            try:
                return int(action(client, args))
            except _ApiError as error:
                say(f"batch: {error}")
                return 1
            except httpx.HTTPError as error:
                say(f"batch: cannot reach the edge at {base}: {describe(error)}")
                return 1
    return handler


class _ApiError(Exception):
    pass


def _call(client: Any, method: str, path: str, **kwargs: Any) -> Any:
    response = client.request(method, path, **kwargs)
    if response.status_code >= 400:
        try:
            message = response.json()["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = response.text[:300]
        raise _ApiError(f"{method} {path}: {response.status_code}: {message}")
    return response.json() if response.headers.get("content-type", "").startswith("application/json") else response


def _submit(client: Any, args: argparse.Namespace) -> int:
    data = args.file.read_bytes()
    endpoint = args.endpoint or json.loads(data.split(b"\n", 1)[0])["url"]
    uploaded = _call(client, "POST", "/v1/files", files={"file": (args.file.name, data)}, data={"purpose": "batch"})
    batch = _call(client, "POST", "/v1/batches", json={"input_file_id": uploaded["id"], "endpoint": endpoint,
                                                       "completion_window": "24h"})
    print(batch["id"])
    if not args.wait:
        return 0
    return _follow(client, batch["id"])


def _follow(client: Any, batch_id: str) -> int:
    while True:
        batch = _call(client, "GET", f"/v1/batches/{batch_id}")
        counts = batch["request_counts"] or {"total": 0, "completed": 0, "failed": 0}
        done, total = counts["completed"] + counts["failed"], max(1, counts["total"])
        bar = "#" * int(30 * done / total)
        sys.stderr.write(f"\r[{bar:<30}] {done}/{counts['total']} ({counts['failed']} failed) {batch['status']:<11}")
        sys.stderr.flush()
        if batch["status"] in _TERMINAL:
            sys.stderr.write("\n")
            print(json.dumps(batch, indent=2))
            return 0 if batch["status"] == "completed" else 1
        time.sleep(1.0)


def _status(client: Any, args: argparse.Namespace) -> int:
    print(json.dumps(_call(client, "GET", f"/v1/batches/{args.batch_id}"), indent=2))
    return 0


def _cancel(client: Any, args: argparse.Namespace) -> int:
    print(json.dumps(_call(client, "POST", f"/v1/batches/{args.batch_id}/cancel"), indent=2))
    return 0


def _list(client: Any, args: argparse.Namespace) -> int:
    for batch in _call(client, "GET", "/v1/batches", params={"limit": args.limit})["data"]:
        counts = batch["request_counts"]
        print(f"{batch['id']}  {batch['status']:<11} {counts['completed']}+{counts['failed']}/{counts['total']}  "
              f"{batch['endpoint']}  created {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(batch['created_at']))}")
    return 0


def _download(client: Any, args: argparse.Namespace) -> int:
    batch = _call(client, "GET", f"/v1/batches/{args.batch_id}")
    args.out.mkdir(parents=True, exist_ok=True)
    wrote = 0
    for kind in ("output_file_id", "error_file_id"):
        if batch.get(kind):
            target = args.out / f"{args.batch_id}_{kind.split('_')[0]}.jsonl"
            target.write_bytes(_call(client, "GET", f"/v1/files/{batch[kind]}/content").content)
            say(f"wrote {target}")
            wrote += 1
    if not wrote:
        say(f"batch {args.batch_id} is {batch['status']}: no files yet")
    return 0 if wrote else 1


def cmd_assembler(args: argparse.Namespace, settings: Settings) -> int:
    from aiokafka.errors import KafkaError

    from streams.batch.assembler import run_assembler

    try:
        asyncio.run(run_assembler(settings))
    except (KafkaError, OSError) as error:
        say(f"batch assembler: error: {describe(error)}")
        return 1
    return 0
