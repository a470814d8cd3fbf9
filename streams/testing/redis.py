"""A real ``redis-server`` (Debian's package) on a port of its own, for the edge's shared limits in tests and in the
chaos bench: started, killed and started again on the same port (the edges' URL stays valid across a restart)."""
from __future__ import annotations

import contextlib
import shutil
import signal
import subprocess
import time

from streams.testing.stack import free_port


class RedisServer:
    def __init__(self, port: int | None = None) -> None:
        self.port = port or free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout_s: float = 20.0) -> None:
        """Start it and wait until it answers PING; fails (never skips) when the binary is missing."""
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server not found: install Debian's redis-server package (./dev test installs it)")
        self.process = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--protected-mode", "yes", "--loglevel", "warning"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )
        import redis

        client = redis.Redis(host="127.0.0.1", port=self.port, socket_connect_timeout=0.5)
        deadline = time.monotonic() + timeout_s
        try:
            while True:
                if self.process.poll() is not None:
                    out = self.process.stdout.read().decode(errors="replace") if self.process.stdout else ""
                    raise RuntimeError(f"redis-server exited: {out}")
                with contextlib.suppress(redis.RedisError):
                    if client.ping():
                        return
                if time.monotonic() > deadline:
                    raise TimeoutError(f"redis-server did not answer PING within {timeout_s:.0f} s")
                time.sleep(0.05)
        finally:
            client.close()

    def kill(self) -> None:
        """kill -9: every count it held is gone, as when a Redis without persistence dies."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(10)

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.kill()


@contextlib.contextmanager
def redis_server():  # noqa: ANN201 - a context manager yielding the URL
    """``redis://127.0.0.1:<port>/0`` of a fresh redis-server, stopped afterwards."""
    server = RedisServer()
    server.start()
    try:
        yield server.url
    finally:
        server.stop()
