"""A static file server over TLS on loopback, for the https:// and hf:// stores: HEAD and GET
with Range (206 and Content-Range), ETag and Last-Modified, If-Match and If-Unmodified-Since
(412), and switches to misbehave as servers in the wild do (no ETag, no Last-Modified, Range
ignored). Its certificate is signed by a test authority made here (``cryptography``), which a
client trusts through ``SSL_CERT_FILE``. ``serve_http`` serves the same over plain HTTP (for
``allow_http``, and for the fault proxy, which speaks plain HTTP/1.1).

``paths`` maps a request path to its bytes (``/cdn/...`` included); ``redirects`` maps a path
to another path it answers 302 with (as the Hub sends a resolve URL to its CDN); ``tokens``
maps a path prefix to the bearer token it requires (a gated repository: 401 without it);
``modified`` maps a path to its Last-Modified date (``DEFAULT_MODIFIED`` otherwise).
"""

from __future__ import annotations

import datetime
import email.utils
import hashlib
import ipaddress
import ssl
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

__all__ = ["DEFAULT_MODIFIED", "HttpsServer", "make_certificates", "serve_http", "serve_https"]

DEFAULT_MODIFIED = "Mon, 07 Dec 2026 10:00:00 GMT"


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def make_certificates(folder: Path) -> tuple[Path, Path, Path]:
    """(authority certificate, server certificate, server key) as PEM files in ``folder``: a
    test authority and a leaf for 127.0.0.1 and localhost that it signs."""
    now = datetime.datetime.now(datetime.UTC)
    valid = (now - datetime.timedelta(days=1), now + datetime.timedelta(days=30))
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (
        x509.CertificateBuilder()
        .subject_name(_name("syvain test authority"))
        .issuer_name(_name("syvain test authority"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(valid[0])
        .not_valid_after(valid[1])
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), False)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    names = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    leaf = (
        x509.CertificateBuilder()
        .subject_name(_name("localhost"))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(valid[0])
        .not_valid_after(valid[1])
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    paths = (folder / "ca.pem", folder / "server.pem", folder / "server.key")
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(leaf.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return paths


@dataclass
class HttpsServer:
    """What the server holds and how it behaves; see the module docstring."""

    port: int = 0
    paths: dict[str, bytes] = field(default_factory=dict)
    redirects: dict[str, str] = field(default_factory=dict)
    tokens: dict[str, str] = field(default_factory=dict)
    modified: dict[str, str] = field(default_factory=dict)
    etags: bool = True
    last_modified: bool = True
    ranges: bool = True
    scheme: str = "https"
    requests: list[tuple[str, str, dict[str, str]]] = field(default_factory=list)

    @property
    def origin(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}"

    def etag(self, path: str) -> str:
        return '"' + hashlib.sha256(self.paths[path]).hexdigest()[:16] + '"'


def _handler(server: HttpsServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        # The head and the body go out in separate writes: with Nagle's algorithm on, the body
        # of a small answer waits for the client's delayed ACK (40 ms) on a kept-alive
        # connection. Web servers set TCP_NODELAY (nginx's default), and so does this one.
        disable_nagle_algorithm = True

        def log_message(self, format: str, *args: object) -> None:  # quiet
            pass

        def do_HEAD(self) -> None:  # noqa: N802
            self._answer(head=True)

        def do_GET(self) -> None:  # noqa: N802
            self._answer(head=False)

        def _empty(self, status: int, headers: dict[str, str] | None = None) -> None:
            self.send_response(status)
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def _answer(self, head: bool) -> None:
            path = self.path
            server.requests.append((self.command, path, dict(self.headers.items())))
            for prefix, token in server.tokens.items():
                if path.startswith(prefix) and self.headers.get("Authorization") != (
                    f"Bearer {token}"
                ):
                    return self._empty(401)
            if path in server.redirects:
                return self._empty(302, {"Location": server.redirects[path]})
            if path not in server.paths:
                return self._empty(404)
            data = server.paths[path]
            etag = server.etag(path)
            expected = self.headers.get("If-Match")
            if expected is not None and server.etags and expected.strip() != etag:
                return self._empty(412)
            modified = server.modified.get(path, DEFAULT_MODIFIED)
            since = self.headers.get("If-Unmodified-Since")
            if (
                since is not None
                and server.last_modified
                and email.utils.parsedate_to_datetime(modified)
                > email.utils.parsedate_to_datetime(since)
            ):
                return self._empty(412)
            start, end, status = 0, len(data), 200
            wanted = self.headers.get("Range")
            if wanted and server.ranges and wanted.startswith("bytes="):
                first, _, last = wanted[len("bytes=") :].partition("-")
                start = int(first)
                end = min(len(data), int(last) + 1) if last else len(data)
                if start >= len(data):
                    return self._empty(416, {"Content-Range": f"bytes */{len(data)}"})
                status = 206
            self.send_response(status)
            self.send_header("Content-Length", str(end - start))
            self.send_header("Accept-Ranges", "bytes" if server.ranges else "none")
            if server.last_modified:
                self.send_header("Last-Modified", modified)
            if server.etags:
                self.send_header("ETag", etag)
            if status == 206:
                self.send_header("Content-Range", f"bytes {start}-{end - 1}/{len(data)}")
            self.end_headers()
            if not head:
                self.wfile.write(data[start:end])

    return Handler


@contextmanager
def serve_https(folder: Path, server: HttpsServer | None = None) -> Iterator[HttpsServer]:
    """Serves ``server`` over TLS on a free loopback port until the block ends; the test
    authority's certificate is ``folder / "ca.pem"``."""
    _, certificate, key = make_certificates(folder)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(certificate, key)
    with _serve(server or HttpsServer(), context) as running:
        yield running


@contextmanager
def serve_http(server: HttpsServer | None = None) -> Iterator[HttpsServer]:
    """Serves ``server`` over plain HTTP on a free loopback port until the block ends."""
    server = server or HttpsServer()
    server.scheme = "http"
    with _serve(server, None) as running:
        yield running


@contextmanager
def _serve(server: HttpsServer, context: ssl.SSLContext | None) -> Iterator[HttpsServer]:
    http = ThreadingHTTPServer(("127.0.0.1", 0), _handler(server))
    http.daemon_threads = True
    if context is not None:
        http.socket = context.wrap_socket(http.socket, server_side=True)
    server.port = http.server_address[1]
    thread = threading.Thread(target=http.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        http.shutdown()
        http.server_close()


def serve_dataset(
    server: HttpsServer,
    tmp: Path,
    records: list[dict[str, Any]],
    data_format: str,
    base: str,
) -> str:
    """``records`` written by the saver to a local folder as 3 shards, served under ``base`` (a
    path on the server) with the manifest's shard URIs pointing there: the served manifest's
    URI."""
    from syvain_training_data import SyvainTrainingData

    root = tmp / data_format
    saver = SyvainTrainingData().dataset_saver(
        f"file://{root}/data-manifest.json",
        data_format=data_format,  # type: ignore[arg-type]
    )
    for shard in range(3):
        saver.save("train", None, records[shard::3], shard_id=f"s{shard}")
    saver.commit_manifest()
    for path in root.rglob("*"):
        if path.is_file() and path.name != "data-manifest.json":
            server.paths[f"{base}/{path.relative_to(root)}"] = path.read_bytes()
    manifest = (root / "data-manifest.json").read_text()
    manifest = manifest.replace(f"file://{root}", f"{server.origin}{base}")
    server.paths[f"{base}/data-manifest.json"] = manifest.encode()
    return f"{server.origin}{base}/data-manifest.json"
