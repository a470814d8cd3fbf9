"""How long an engine worker takes from its process start to `ready` (model loaded, partitions assigned).

    python -m bench.worker_start --checkout before=/path/to/old/clone --checkout after=. --rounds 3

Each round starts, one after another, a worker of every checkout (`python -m streams.cli worker` in that
folder, the default model, a topic prefix of its own) in two bytecode modes: `compiled` (bytecode cached under
a folder of this run, filled by a first unmeasured start of each checkout) and `source` (PYTHONDONTWRITEBYTECODE=1
and no cache: every module compiled from source, as a fresh CI machine did before `./dev` cached bytecode).
Rounds alternate the order, so drift of a shared machine hits every variant alike; medians are reported.
A worker is stopped as soon as it says it is ready. Kafka must be running (`--bootstrap-servers`, default the
local broker).
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from streams.testing.stack import Process, _stop, stack_env

READY = "ready: model"


def start_seconds(checkout: Path, bootstrap: str, env_extra: dict[str, str], timeout_s: float = 300.0) -> float:
    """Seconds from spawning a worker in `checkout` to its ready line; the worker is stopped then."""
    # The stacks' environment (this run's SPECSTREAM_* dropped), without the caller's bytecode settings: the mode's.
    env = stack_env(bootstrap, f"ws-{uuid.uuid4().hex[:8]}", "unused", 1,
                    {"SPECSTREAM_ENGINE__KV_CACHE_BYTES": "96MiB"})
    for name in ("PYTHONPYCACHEPREFIX", "PYTHONDONTWRITEBYTECODE"):
        env.pop(name, None)
    env.update(env_extra)
    started = time.monotonic()
    popen = subprocess.Popen([sys.executable, "-m", "streams.cli", "worker"], cwd=checkout, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        assert popen.stdout is not None
        for line in popen.stdout:
            if READY in line:
                return time.monotonic() - started
            if time.monotonic() - started > timeout_s:
                break
        raise RuntimeError(f"worker in {checkout} never said ready (exit status {popen.poll()})")
    finally:
        _stop(Process("worker", popen, Path(os.devnull)), timeout_s=30.0)  # its output is the pipe, no log file


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkout", action="append", required=True, metavar="NAME=PATH",
                        help="a clone to start workers from (repeat: compared side by side)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--bootstrap-servers", default=None, help="default: the local broker of infra.kafka")
    args = parser.parse_args(argv)
    checkouts = {}
    for item in args.checkout:
        name, _, path = item.partition("=")
        checkouts[name] = Path(path).resolve()
    if args.bootstrap_servers is None:
        from infra.kafka.broker import single_node, start
        from infra.kafka.cli import SINGLE_PORT_ENV
        from infra.kafka.paths import env_port

        spec = single_node(port=env_port(SINGLE_PORT_ENV, 9092))
        start(spec)
        args.bootstrap_servers = spec.bootstrap_servers
    with tempfile.TemporaryDirectory(prefix="specstream-pycache-") as cache:
        modes = {"compiled": {"PYTHONPYCACHEPREFIX": cache}, "source": {"PYTHONDONTWRITEBYTECODE": "1"}}
        for name, path in checkouts.items():  # fills the bytecode cache for `compiled`
            print(f"warm-up start of {name}: {start_seconds(path, args.bootstrap_servers, modes['compiled']):.1f} s",
                  flush=True)
        variants = [(name, mode) for name in checkouts for mode in modes]
        seconds: dict[tuple[str, str], list[float]] = {v: [] for v in variants}
        for round_ in range(args.rounds):
            for name, mode in variants if round_ % 2 == 0 else list(reversed(variants)):
                took = start_seconds(checkouts[name], args.bootstrap_servers, modes[mode])
                seconds[(name, mode)].append(took)
                print(f"round {round_ + 1}: {name:>10} {mode:>8} {took:6.1f} s", flush=True)
    print("\nmedian seconds to ready:")
    for (name, mode), values in seconds.items():
        print(f"  {name:>10} {mode:>8} {statistics.median(values):6.1f}  ({', '.join(f'{v:.1f}' for v in values)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
