"""Small HTTP servers on 127.0.0.1 for the credential tests (stdlib ``http.server`` in a thread).

``FakeAws`` plays, on one port:

- an S3-compatible store that accepts anything (GET and HEAD of a key answer its bytes in
  ``objects``, or ``hello``, ranged GETs their range; PUT answers an etag) and records each
  request's method, path and headers; ``signers`` verifies each request's SigV4 signature
  with the credentials this server (or a ``FakeSts`` of ``issuers``) handed out, or those a
  test gave its client (``trust``), so a test sees which key, secret and token signed it;
- the container credentials service (``GET /creds``, checking ``Authorization`` when a token
  is expected);
- the EC2 instance metadata service, IMDSv2 (``PUT /latest/api/token``, then
  ``GET /latest/meta-data/iam/security-credentials/`` and ``.../{role}`` with the token).

Each credentials answer is a new key pair (``KEY1``, ``KEY2``, ...), expiring after
``expires_in`` seconds (0: already due for refresh, so every signed request fetches again).
"""

from __future__ import annotations

import datetime
import hashlib
import hmac
import json
import threading
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self

from s3_signing import authorization_fields, expected_signature

ROLE = "test-role"
IMDS_TOKEN = "imds-session-token"


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def _record(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        headers = {name.lower(): value for name, value in self.headers.items()}
        with self.server.fake.lock:
            self.server.fake.requests.append((self.command, self.path, headers))
            self.server.fake.payload_hashes.append(hashlib.sha256(body).hexdigest())

    def _send(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _credentials(self) -> bytes:
        fake = self.server.fake
        with fake.lock:
            fake.issued += 1
            number = fake.issued
            fake.credentials[f"KEY{number}"] = (f"secret-{number}", f"token-{number}")
        expiration = datetime.datetime.now(datetime.UTC) + datetime.timedelta(
            seconds=fake.expires_in
        )
        return json.dumps(
            {
                "Code": "Success",
                "AccessKeyId": f"KEY{number}",
                "SecretAccessKey": f"secret-{number}",
                "Token": f"token-{number}",
                "Expiration": expiration.strftime("%Y-%m-%dT%H:%M:%SZ"),
            }
        ).encode()

    def do_PUT(self) -> None:  # noqa: N802
        self._record()
        if self.path == "/latest/api/token":
            if "X-aws-ec2-metadata-token-ttl-seconds" not in self.headers:
                self._send(400)
            else:
                self._send(200, IMDS_TOKEN.encode())
            return
        self._send(200, headers={"ETag": '"put-etag"'})

    def do_HEAD(self) -> None:  # noqa: N802
        self.do_GET()

    def do_GET(self) -> None:  # noqa: N802
        self._record()
        fake = self.server.fake
        if self.path == "/creds":
            expected = fake.container_token
            if expected is not None and self.headers.get("Authorization") != expected:
                self._send(401, b"bad authorization token")
                return
            self._send(200, self._credentials(), {"Content-Type": "application/json"})
            return
        if self.path.startswith("/latest/meta-data/iam/security-credentials/"):
            if self.headers.get("X-aws-ec2-metadata-token") != IMDS_TOKEN:
                self._send(401)
                return
            role = self.path.rsplit("/", 1)[1]
            if not role:
                self._send(200, ROLE.encode())
            elif role == ROLE:
                self._send(200, self._credentials(), {"Content-Type": "application/json"})
            else:
                self._send(404)
            return
        with fake.lock:
            failing = fake.fail_next > 0
            fake.fail_next -= failing
        if failing:
            self._send(503, b"<Error><Code>SlowDown</Code></Error>")
            return
        body = fake.objects.get(self.path.split("?", 1)[0], b"hello")
        headers = {
            "ETag": '"hello-etag"',
            "Last-Modified": formatdate(usegmt=True),
            "Content-Type": "application/octet-stream",
        }
        wanted = self.headers.get("Range", "")
        if wanted.startswith("bytes="):  # a ranged read, as streams make: "bytes=a-b" or "a-"
            first, _, last = wanted[len("bytes=") :].partition("-")
            start, end = int(first), min(int(last) if last else len(body) - 1, len(body) - 1)
            headers["Content-Range"] = f"bytes {start}-{end}/{len(body)}"
            self._send(206, body[start : end + 1], headers)
            return
        self._send(200, body, headers)


class _Serving:
    """A server of ours on 127.0.0.1 in a thread: ``with`` starts and stops it."""

    _server: ThreadingHTTPServer

    def _serve(self, scheme: str = "http") -> None:
        self._scheme = scheme
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"{self._scheme}://{host}:{port}"

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    fake: FakeAws

    def process_request(self, request: Any, client_address: Any) -> None:
        with self.fake.lock:  # connections are accepted one after another, in order
            self.fake.connections += 1
        super().process_request(request, client_address)


class FakeAws(_Serving):
    """See the module docstring. Use as a context manager; ``url`` is ``http://127.0.0.1:PORT``."""

    def __init__(
        self,
        *,
        expires_in: float = 3600,
        container_token: str | None = None,
        issuers: tuple[FakeSts, ...] = (),
    ) -> None:
        self.expires_in = expires_in
        self.container_token = container_token
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        self.payload_hashes: list[str] = []  # the sha256 of each request's body
        # Access key -> (secret, session token) of the keys this server handed out or trusts.
        self.credentials: dict[str, tuple[str, str | None]] = {}
        self.issuers = issuers
        # GET bodies by path ("/bucket/key"); any other key answers b"hello".
        self.objects: dict[str, bytes] = {}
        # How many of the next store GETs answer 503 (a transient failure to retry).
        self.fail_next = 0
        self.issued = 0
        self.connections = 0  # accepted so far
        self.lock = threading.Lock()
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.fake = self
        self._serve()

    def read(self, config: Any, times: int = 1) -> None:
        """Reads ``times`` objects from this store with ``config`` (a StorageConfig)."""
        from syvain_training_data.storage import get_object

        for i in range(times):
            assert get_object(f"s3://bucket/key-{i}", storage_config=config) == b"hello"

    def s3_requests(self) -> list[tuple[str, str, dict[str, str]]]:
        """The requests made to the store (not to the credential services)."""
        with self.lock:
            return [
                request
                for request in self.requests
                if request[1] != "/creds" and not request[1].startswith("/latest/")
            ]

    def credential_requests(self) -> list[tuple[str, str, dict[str, str]]]:
        with self.lock:
            return [
                request
                for request in self.requests
                if request[1] == "/creds" or request[1].startswith("/latest/")
            ]

    def trust(self, access_key_id: str, secret_access_key: str, token: str | None = None) -> None:
        """Credentials a test gave its client itself, to verify the signatures made with."""
        with self.lock:
            self.credentials[access_key_id] = (secret_access_key, token)

    def signers(self) -> list[tuple[str, str, str | None] | str | None]:
        """Per store request: None when unsigned; (access key, secret, session token) when its
        SigV4 signature verifies with the secret handed out (or trusted) for its key, its
        ``x-amz-security-token`` is that key's token (absent without one) and is signed, and
        its payload hash is its body's (or UNSIGNED-PAYLOAD); else a str saying what failed."""
        with self.lock:
            known = dict(self.credentials)
            received = list(zip(self.requests, self.payload_hashes, strict=True))
        for issuer in self.issuers:
            with issuer.lock:
                known.update(issuer.credentials)
        return [
            _signer(method, target, headers, payload, known)
            for (method, target, headers), payload in received
            if target != "/creds" and not target.startswith("/latest/")
        ]

    def signing_keys(self) -> list[str | None]:
        """The access key of each store request whose signature verifies (see ``signers``),
        None when unsigned, or what failed."""
        return [s[0] if isinstance(s, tuple) else s for s in self.signers()]


def _signer(
    method: str,
    target: str,
    headers: dict[str, str],
    payload: str,
    known: dict[str, tuple[str, str | None]],
) -> tuple[str, str, str | None] | str | None:
    """One request's signer for ``FakeAws.signers``."""
    if "authorization" not in headers:
        return None
    fields = authorization_fields(headers["authorization"])
    key = fields["Credential"].split("/", 1)[0]
    if key not in known:
        return f"{key}: a key never handed out"
    secret, token = known[key]
    if headers.get("x-amz-content-sha256") not in ("UNSIGNED-PAYLOAD", payload):
        return f"{key}: the payload hash is not the body's"
    if headers.get("x-amz-security-token") != token:
        return f"{key}: token {headers.get('x-amz-security-token')!r}, handed out {token!r}"
    if token is not None and "x-amz-security-token" not in fields["SignedHeaders"].split(";"):
        return f"{key}: the session token is not signed"
    expected = expected_signature(method, target, headers, secret)
    if not hmac.compare_digest(expected, fields["Signature"]):
        return f"{key}: the signature does not verify with {secret!r}"
    return key, secret, token


class _StsHandler(BaseHTTPRequestHandler):
    server: _StsServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def do_POST(self) -> None:  # noqa: N802
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        from urllib.parse import parse_qs, urlsplit

        query = {
            name: values[0]
            for name, values in parse_qs(
                urlsplit(self.path).query or body.decode(), keep_blank_values=True
            ).items()
        }
        # AssumeRoleWithWebIdentity (object_store) or AssumeRole (botocore's role profiles).
        action = query.get("Action", "AssumeRoleWithWebIdentity")
        prefix = "WEBKEY" if action == "AssumeRoleWithWebIdentity" else "ROLEKEY"
        sts = self.server.sts
        with sts.lock:
            sts.calls.append(query)
            sts.authorizations.append(self.headers.get("Authorization"))
            sts.issued += 1
            number = sts.issued
            sts.credentials[f"{prefix}{number}"] = (f"web-secret-{number}", f"web-token-{number}")
        expiration = datetime.datetime.now(datetime.UTC) + datetime.timedelta(
            seconds=sts.expires_in
        )
        user = (
            "<AssumedRoleUser><Arn>arn:aws:sts::123456789012:assumed-role/reader/test</Arn>"
            "<AssumedRoleId>AROATEST:test</AssumedRoleId></AssumedRoleUser>"
        )
        answer = (
            f'<{action}Response xmlns="https://sts.amazonaws.com/doc/2011-06-15/">'
            f"<{action}Result><Credentials>"
            f"<AccessKeyId>{prefix}{number}</AccessKeyId>"
            f"<SecretAccessKey>web-secret-{number}</SecretAccessKey>"
            f"<SessionToken>web-token-{number}</SessionToken>"
            f"<Expiration>{expiration.strftime('%Y-%m-%dT%H:%M:%SZ')}</Expiration>"
            f"</Credentials>{user}</{action}Result>"
            f"<ResponseMetadata><RequestId>{number}</RequestId></ResponseMetadata>"
            f"</{action}Response>"
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/xml")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def do_GET(self) -> None:  # noqa: N802
        """The SSO portal's GetRoleCredentials (botocore's SSO profiles)."""
        from urllib.parse import parse_qs, urlsplit

        parts = urlsplit(self.path)
        query = {name: values[0] for name, values in parse_qs(parts.query).items()}
        sts = self.server.sts
        with sts.lock:
            sts.calls.append({"path": parts.path, **query})
            sts.authorizations.append(self.headers.get("x-amz-sso_bearer_token"))
            sts.credentials["SSOKEY"] = ("sso-secret", "sso-session-token")
        if parts.path != "/federation/credentials":
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        expiration_ms = int(
            (datetime.datetime.now(datetime.UTC).timestamp() + sts.expires_in) * 1000
        )
        answer = json.dumps(
            {
                "roleCredentials": {
                    "accessKeyId": "SSOKEY",
                    "secretAccessKey": "sso-secret",
                    "sessionToken": "sso-session-token",
                    "expiration": expiration_ms,
                }
            }
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)


class _StsServer(ThreadingHTTPServer):
    daemon_threads = True
    sts: FakeSts


class FakeSts(_Serving):
    """STS over HTTPS on 127.0.0.1 (object_store calls it over HTTPS only), with a certificate
    of ``certificate_authority``'s: AssumeRoleWithWebIdentity and AssumeRole, each answering a
    new key pair (``WEBKEY1``..., ``ROLEKEY1``...); records each call's parameters and
    ``Authorization`` header."""

    def __init__(self, cert_file: str, key_file: str, *, expires_in: float = 3600) -> None:
        import ssl

        self.expires_in = expires_in
        self.calls: list[dict[str, str]] = []
        self.authorizations: list[str | None] = []
        # Access key -> (secret, session token) of the keys it handed out (FakeAws issuers).
        self.credentials: dict[str, tuple[str, str | None]] = {}
        self.issued = 0
        self.lock = threading.Lock()
        self._server = _StsServer(("127.0.0.1", 0), _StsHandler)
        self._server.sts = self
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert_file, key_file)
        self._server.socket = context.wrap_socket(self._server.socket, server_side=True)
        self._serve(scheme="https")


def certificate_authority(directory: str) -> tuple[str, str, str]:
    """A throwaway CA and a server certificate for 127.0.0.1 made with the openssl command:
    (CA certificate file, server certificate file, server key file)."""
    import subprocess
    from pathlib import Path

    root = Path(directory)
    ca_key, ca_cert = root / "ca.key", root / "ca.pem"
    key, csr, cert, ext = (
        root / "server.key",
        root / "server.csr",
        root / "server.pem",
        root / "ext",
    )
    ext.write_text(
        "basicConstraints=CA:FALSE\nsubjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n"
    )

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)

    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(ca_key),
            "-out", str(ca_cert), "-days", "2", "-subj", "/CN=syvain test CA")  # fmt: skip
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(csr),
            "-subj", "/CN=127.0.0.1")  # fmt: skip
    openssl("x509", "-req", "-in", str(csr), "-CA", str(ca_cert), "-CAkey", str(ca_key),
            "-CAcreateserial", "-out", str(cert), "-days", "2", "-extfile", str(ext))  # fmt: skip
    return str(ca_cert), str(cert), str(key)


def returns_answer(value: Any) -> Any:
    """A credential provider named ``bad_provider`` that returns ``value``."""

    def provider() -> Any:
        return value

    provider.__qualname__ = "bad_provider"
    return provider


ANSWER_SECRET = "do-not-echo-this-secret"
GOOD_ANSWER = {"access_key_id": "AKID", "secret_access_key": ANSWER_SECRET}
