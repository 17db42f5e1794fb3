"""Connection facts of a running S3 server (a throwaway SeaweedFS or an external one) and one
signed request to it, for the integration tests. Standard library only.
"""

from __future__ import annotations

import http.client
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from s3_signing import DEFAULT_REGION, canonical_target, sign_headers

DEFAULT_BUCKETS = ("syvain-test", "syvain-data")
LOOPBACK = "127.0.0.1"


class SeaweedStartError(RuntimeError):
    """weed mini did not come up; the message carries the tail of its log."""


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
