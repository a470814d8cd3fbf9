"""Suffix decoding through the stack (issue 41): the extraction workload over the edge, Kafka and a worker.

    .venv/bin/python -m infra.kafka start
    python -m bench.suffix_stack                                   # plain, ngram, suffix; int4 (the default)
    python -m bench.suffix_stack --methods plain,suffix --warm 40 --batch1 20 --concurrent-requests 32

For each method a stack of its own (edge + one worker, streams.testing.stack) with
`engine.speculation` set to it, then `specstream bench` on bench.structured_workload's extractions, in order:
--warm requests untimed (at 4 in flight; suffix decoding learns their answers, as a worker that has been running
has), then the next --batch1 one at a time and the next --concurrent-requests at 16 in flight, each answer
ending at EOS (at most --output-len tokens), greedy. Prints output tokens/s and TTFT p50 per method and load, and
the ratio to plain; the raw `specstream bench` files land beside --out.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.openai_load import drive
from bench.result_files import default_out
from bench.structured_workload import extraction_workloads
from streams.testing.stack import running_stack

METHODS = {"plain": {"SPECSTREAM_ENGINE__SPECULATION__ENABLED": "false"},
           "ngram": {"SPECSTREAM_ENGINE__SPECULATION__METHOD": "ngram"},
           "suffix": {"SPECSTREAM_ENGINE__SPECULATION__METHOD": "suffix"}}


def datasets(args: argparse.Namespace, into: Path) -> dict[str, Path]:
    """The warm, batch-1 and concurrent requests as `specstream bench --dataset` files, in workload order."""
    items = extraction_workloads(args.warm + args.batch1 + args.concurrent_requests)
    parts = {"warm": items[:args.warm], "batch1": items[args.warm:args.warm + args.batch1],
             "concurrent": items[args.warm + args.batch1:]}
    files = {}
    for name, part in parts.items():
        files[name] = into / f"{name}.jsonl"
        files[name].write_text("".join(json.dumps({"messages": w.messages}) + "\n" for w in part))
    return files


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--warm", type=int, default=100)
    ap.add_argument("--batch1", type=int, default=40)
    ap.add_argument("--concurrent-requests", type=int, default=64)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--bootstrap", default="127.0.0.1:9092")
    ap.add_argument("--out", default=None, help="the summary (default bench/results/<date>-suffix-stack.json)")
    args = ap.parse_args(argv)
    out = Path(args.out or default_out("suffix-stack"))
    raw = Path(tempfile.mkdtemp(prefix="suffix-stack-"))
    files = datasets(args, raw)
    figures: dict[str, dict[str, Any]] = {}
    for method in args.methods.split(","):
        print(f"  {method} ...", file=sys.stderr, flush=True)
        with running_stack(args.bootstrap, env=METHODS[method], ready_timeout_s=600) as stack:
            url, key = stack.base_url, stack.api_key

            def run(part: str, requests: int, concurrency: int) -> dict[str, Any]:
                return drive(url, key, ["--dataset", str(files[part]), "--no-shuffle"], concurrency=concurrency,
                             requests=requests, output_len=args.output_len, out=raw / f"{method}-{part}.json")

            run("warm", args.warm, 4)
            figures[method] = {"batch1": run("batch1", args.batch1, 1),
                               "concurrent:16": run("concurrent", args.concurrent_requests, 16)}
    for method, loads in figures.items():
        for load, fig in loads.items():
            base = figures.get("plain", {}).get(load)
            fig["x_plain"] = fig["output_tok_s"] / base["output_tok_s"] if base else None
            print(f"{method:7} {load:14} {fig['output_tok_s']:8.1f} tok/s  TTFT p50 {fig['ttft_p50_ms']:7.1f} ms"
                  f"  x plain {fig['x_plain'] or 0:.2f}")
    out.write_text(json.dumps({"command": "python -m bench.suffix_stack " + " ".join(argv or sys.argv[1:]),
                               "args": vars(args), "raw": str(raw), "figures": figures}, indent=1) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
