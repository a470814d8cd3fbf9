"""SIGTERM ends an edge within edge.shutdown_grace_s even while a client's request is still in flight (uvicorn alone
waits for every connection to close, however long: found by the chaos soak, an edge still serving 60 s after it)."""
from __future__ import annotations

import signal
import socket
import subprocess
import time

import pytest

from streams.testing.stack import running_stack
from tests.kafka_fixtures import kafka_bootstrap, kafka_single  # noqa: F401

pytestmark = [pytest.mark.kafka]

GRACE_S = 2


def test_sigterm_ends_the_edge_within_its_grace_while_a_request_is_in_flight(
        kafka_bootstrap: str) -> None:  # noqa: F811
    grace = {"SPECSTREAM_EDGE__SHUTDOWN_GRACE_S": str(GRACE_S)}
    with running_stack(kafka_bootstrap, worker=False, env=grace) as stack:
        edge = stack.processes[0].popen
        # An upload whose body is still arriving: a request in flight that no reply will end.
        with socket.create_connection(("127.0.0.1", stack.port)) as client:
            head = (f"POST /v1/files HTTP/1.1\r\nHost: edge\r\nAuthorization: Bearer {stack.api_key}\r\n"
                    "Content-Type: multipart/form-data; boundary=b\r\nContent-Length: 100000\r\n\r\n--b\r\n")
            client.sendall(head.encode())
            time.sleep(0.5)
            stopped = time.monotonic()
            edge.send_signal(signal.SIGTERM)
            try:
                edge.wait(GRACE_S + 15)
            except subprocess.TimeoutExpired:
                pytest.fail(f"edge still running {GRACE_S + 15} s after SIGTERM with a request in flight\n"
                            f"{stack.logs()}")
        assert time.monotonic() - stopped < GRACE_S + 15
