"""A process exits with its own status while a daemon thread waits in native code (a retry
backoff, a stalled read): before Python 3.14 such a thread is killed with pthread_exit when it
takes the GIL back during finalization, which used to abort the process ("FATAL: exception not
rethrown", status 134). The servers are the test's own, on 127.0.0.1."""

from __future__ import annotations

import http.server
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

pytestmark = pytest.mark.timeout(120)

# The child: a daemon thread calls into the package against the server on PORT; the main thread
# waits for the test's word on stdin (the server saw the request) and, when the call retries,
# for its retry warning (the thread then sleeps in its backoff), then exits with status 3.
CHILD = """
import logging, sys, threading, time
from syvain_training_data import ManifestShard, SyvainTrainingData
from syvain_training_data.shard import iter_shard
from syvain_training_data.testing import storage_policy

port, call = int(sys.argv[1]), sys.argv[2]
endpoint = f"http://127.0.0.1:{port}"
options = dict(region="us-east-1", access_key_id="k", secret_access_key="s")
client = SyvainTrainingData(s3_base_url=endpoint, **options)

def work():
    if call == "load_manifest":
        client.load_manifest("s3://b/m.json")
    else:
        shard = ManifestShard(uri="s3://b/s.jsonl.gz", records=1, size_bytes=100)
        list(iter_shard("jsonl.gz", shard, storage_config=client.storage_config))
    print("the call returned", file=sys.stderr)

class Retrying(logging.Handler):
    def emit(self, record):
        retrying.set()

class HoldsFinalizationOpen:
    # Cleared with this module, once finalization has begun: it keeps that phase open for
    # several of the waiting thread's 50 ms polls, so the thread surely wakes inside it.
    sleep = staticmethod(time.sleep)  # the module may be gone by then

    def __del__(self):
        self.sleep(0.5)

holder = HoldsFinalizationOpen()
retrying = threading.Event()
logging.getLogger("syvain_training_data.storage").addHandler(Retrying())
# Short backoffs: the thread wakes, retries and logs while the interpreter finalizes.
with storage_policy(backoff_base_s=0.05, backoff_cap_s=0.05):
    threading.Thread(target=work, daemon=True).start()
    sys.stdin.readline()
    if call == "load_manifest" and not retrying.wait(60):
        sys.exit("no retry warning")
    sys.exit(3)
"""


class _Unavailable(http.server.BaseHTTPRequestHandler):
    def _answer(self) -> None:
        self.send_response(503)
        self.send_header("Content-Length", "0")
        self.end_headers()
        self.server.seen.set()  # type: ignore[attr-defined]

    do_GET = do_HEAD = _answer

    def log_message(self, *args: object) -> None:
        pass


@contextmanager
def unavailable_server() -> Iterator[tuple[int, threading.Event]]:
    """A server answering 503 to everything; the event is set once it answered."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Unavailable)
    server.seen = threading.Event()  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1], server.seen  # type: ignore[attr-defined]
    finally:
        server.shutdown()
        server.server_close()


@contextmanager
def silent_server() -> Iterator[tuple[int, threading.Event]]:
    """A server that reads requests and never answers; the event is set once one arrived."""
    listener = socket.create_server(("127.0.0.1", 0))
    seen = threading.Event()
    held: list[socket.socket] = []

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            held.append(conn)
            if conn.recv(65536):
                seen.set()

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield listener.getsockname()[1], seen
    finally:
        listener.close()
        for conn in held:
            conn.close()


@pytest.mark.parametrize(
    ("server", "call"),
    [(unavailable_server, "load_manifest"), (silent_server, "iter_shard")],
    ids=["retry-backoff", "stalled-read"],
)
def test_exit_status_is_kept_while_a_thread_waits_in_native_code(server, call) -> None:
    with server() as (port, seen):
        child = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(port), call],
            stdin=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert seen.wait(60), "the child's request never arrived"
            _, stderr = child.communicate("\n", timeout=60)
        finally:
            if child.poll() is None:
                child.kill()
    assert "FATAL" not in stderr and "the call returned" not in stderr, stderr
    assert child.returncode == 3, stderr
