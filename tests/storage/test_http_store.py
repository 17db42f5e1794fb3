"""Plain http:// (read only where the caller passes ``allow_http=True``, SPEC section 4's web
store without TLS) and servers that name a version by Last-Modified alone, against a plain-HTTP
server on loopback (``https_server.serve_http``), with our fault proxy where a read must be
made to resume: a read is held to the first response's Last-Modified and fails closed when the
object changes; a server with neither an ETag nor a Last-Modified is refused at once."""

from __future__ import annotations

import io
import random
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import fault_proxy as proxy_faults
from fault_proxy import FaultProxy
from https_server import DEFAULT_MODIFIED, HttpsServer, serve_dataset, serve_http
from resumed_reads import as_list, interrupted_and_resumed
from syvain_training_data import ObjectChangedError, SyvainTrainingData
from syvain_training_data.cli import main
from syvain_training_data.formats.parquet.reader import open_native
from syvain_training_data.manifest import ManifestShard
from syvain_training_data.storage import (
    StorageConfig,
    get_object,
    head_object,
    native_storage,
    open_stream,
)
from syvain_training_data.testing import storage_policy

MIB = 1024 * 1024
RECORDS = [{"i": i, "text": "h" * (i % 89)} for i in range(300)]
ALLOW = StorageConfig(allow_http=True)
FAST_BACKOFF = {"backoff_base_s": 0.01, "backoff_cap_s": 0.05}
pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def server() -> Iterator[HttpsServer]:
    with serve_http() as running:
        yield running


@pytest.fixture
def proxy(server) -> Iterator[FaultProxy]:
    with FaultProxy("127.0.0.1", server.port) as running:
        yield running


@pytest.fixture
def versions(server) -> Iterator[HttpsServer]:
    """The server without ETags (Last-Modified alone), restored afterwards."""
    server.etags = False
    try:
        yield server
    finally:
        server.etags = server.last_modified = True


def publish(server: HttpsServer, tmp: Path, base: str) -> str:
    """A msgpack.zstf dataset the saver wrote locally, served under ``base``: its manifest URI."""
    return serve_dataset(server, tmp, RECORDS, "msgpack.zstf", base)


def test_plain_http_is_refused_at_the_call_without_the_opt_in(server):
    server.paths["/plain/a.json"] = b"{}"
    server.requests.clear()
    uri = f"{server.origin}/plain/a.json"
    calls = {
        "get": lambda: get_object(uri),
        "head": lambda: head_object(uri),
        "stream": lambda: open_stream(uri, size_bytes=2),
        "manifest": lambda: SyvainTrainingData().load_manifest(uri),
    }
    for name, call in calls.items():
        started = time.monotonic()
        with pytest.raises(ValueError, match="allow_http=True") as raised:
            call()
        assert uri in str(raised.value), name
        assert time.monotonic() - started < 5, name  # refused, never retried
    assert server.requests == []  # not one request went out
    assert get_object(uri, storage_config=ALLOW) == b"{}"
    assert head_object(uri, storage_config=ALLOW).size == 2


def test_a_dataset_over_plain_http_loads_and_resumes_with_the_opt_in(server, tmp_path):
    uri = publish(server, tmp_path, "/over-http")
    with pytest.raises(ValueError, match="allow_http"):
        SyvainTrainingData().load_manifest(uri)
    client = SyvainTrainingData(allow_http=True)
    assert "allow_http=True" in repr(client)
    seen = interrupted_and_resumed(client, uri, "i", seed=3, batches_before=6)
    assert sorted(seen) == list(range(len(RECORDS)))


def test_the_command_line_reads_http_with_allow_http(server, tmp_path):
    uri = publish(server, tmp_path, "/cli")
    out, err = io.StringIO(), io.StringIO()
    assert main(["inspect", uri], environ={}, stdout=out, stderr=err) == 2
    assert "pass --allow-http" in err.getvalue() and uri in err.getvalue()
    out, err = io.StringIO(), io.StringIO()
    assert main(["--allow-http", "inspect", uri], environ={}, stdout=out, stderr=err) == 0
    assert str(len(RECORDS)) in out.getvalue()


def test_an_http_manifest_names_shards_of_its_own_scheme_and_host_only(server, tmp_path):
    uri = publish(server, tmp_path, "/confined")
    body = server.paths["/confined/data-manifest.json"].decode()
    client = SyvainTrainingData(allow_http=True)
    cases = {
        f"https://127.0.0.1:{server.port}": "may name only http:// shards",
        f"http://localhost:{server.port}": "may name only shards on that host",
    }
    for other, problem in cases.items():
        server.paths["/confined/bad.json"] = body.replace(server.origin, other).encode()
        bad = f"{server.origin}/confined/bad.json"
        loader = client.split_data_loader(bad, as_list, {"batch_size": 4})
        with pytest.raises(ValueError, match=problem):
            list(loader.load("train"))
    assert uri.endswith("/confined/data-manifest.json")


def test_an_http_hub_endpoint_needs_the_opt_in_too(server, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", server.origin)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    native_storage.cache_clear()
    server.paths["/datasets/o/n/resolve/main/a.json"] = b"[1]"
    with pytest.raises(ValueError, match="HF_ENDPOINT is a plain http:// address"):
        get_object("hf://datasets/o/n/a.json")
    assert get_object("hf://datasets/o/n/a.json", storage_config=ALLOW) == b"[1]"


# --- versions by Last-Modified ---------------------------------------------------------------


def test_a_server_with_last_modified_and_no_etag_is_read(versions):
    versions.paths["/lm/a.bin"] = data = random.Random(1).randbytes(300_000)
    uri = f"{versions.origin}/lm/a.bin"
    assert head_object(uri, storage_config=ALLOW).etag == ""
    with open_stream(uri, size_bytes=len(data), storage_config=ALLOW) as stream:
        assert b"".join(stream) == data
    with open_stream(uri, size_bytes=len(data), start=1000, storage_config=ALLOW) as stream:
        assert b"".join(stream) == data[1000:]


def test_a_resumed_read_is_held_to_the_first_last_modified(versions, proxy):
    versions.paths["/lm/held.bin"] = data = random.Random(2).randbytes(4 * MIB)
    versions.modified["/lm/held.bin"] = DEFAULT_MODIFIED
    uri = f"http://127.0.0.1:{proxy.port}/lm/held.bin"
    proxy.script(proxy_faults.reset_after(1 * MIB, method="GET"))
    versions.requests.clear()
    with storage_policy(**FAST_BACKOFF):
        stream = open_stream(uri, size_bytes=len(data), storage_config=ALLOW)
        assert b"".join(stream) == data and stream.resumes == 1
    gets = [
        {name.lower(): value for name, value in headers.items()}
        for method, _, headers in versions.requests
        if method == "GET"
    ]
    assert len(gets) == 2
    assert "if-unmodified-since" not in gets[0]
    assert gets[1]["if-unmodified-since"] == DEFAULT_MODIFIED and "if-match" not in gets[1]


@pytest.mark.parametrize(
    ("new_date", "how"),
    [
        ("Tue, 08 Dec 2026 10:00:00 GMT", "later: the server answers 412"),
        ("Sun, 06 Dec 2026 10:00:00 GMT", "earlier: If-Unmodified-Since passes, the date differs"),
    ],
)
def test_an_object_replaced_mid_read_fails_closed(versions, proxy, new_date, how):
    path = "/lm/replaced.bin"
    versions.paths[path] = data = random.Random(3).randbytes(4 * MIB)
    versions.modified[path] = DEFAULT_MODIFIED
    uri = f"http://127.0.0.1:{proxy.port}{path}"
    # The stream resumes only after 3 quiet seconds: the replacement below has long happened.
    proxy.script(proxy_faults.stall_after(1 * MIB, 600.0, method="GET"))
    with storage_policy(read_inactivity_timeout_s=3.0, **FAST_BACKOFF):
        stream = open_stream(uri, size_bytes=len(data), storage_config=ALLOW)
        received = bytearray(stream.read_chunk() or b"")
        versions.paths[path] = random.Random(4).randbytes(4 * MIB)  # same size, new bytes
        versions.modified[path] = new_date
        with pytest.raises(ObjectChangedError, match="Last-Modified") as raised:
            for chunk in stream:
                received += chunk
    assert uri in str(raised.value), how
    assert data.startswith(bytes(received)) and len(received) < len(data)


@pytest.mark.parametrize("change", ["touched", "rewritten"])
def test_a_parquet_read_holds_its_pages_to_the_version_of_its_footer(versions, change):
    # Several streams read one Parquet file (the footer at open, then the pages): each is held
    # to the version the first saw, by Last-Modified (a later date on the same bytes) or by
    # ETag (a byte of a page changed, the size kept).
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    rows = 20_000
    texts = [random.Random(i).randbytes(60).hex() for i in range(rows)]
    sink = io.BytesIO()
    pq.write_table(pa.table({"i": range(rows), "text": texts}), sink, row_group_size=5000)
    path = f"/pq/{change}.parquet"
    versions.paths[path] = data = sink.getvalue()
    versions.modified[path] = DEFAULT_MODIFIED
    versions.etags = change == "rewritten"
    shard = ManifestShard(uri=f"{versions.origin}{path}", records=rows, size_bytes=len(data))
    reader = open_native(shard, ALLOW, 0, None, None, None)  # the footer is read here
    if change == "touched":
        versions.modified[path] = "Tue, 08 Dec 2026 10:00:00 GMT"
    else:
        changed = bytearray(data)
        changed[len(data) // 3] ^= 0xFF
        versions.paths[path] = bytes(changed)
    version = "Last-Modified" if change == "touched" else "etag"
    with pytest.raises(ObjectChangedError, match=version) as raised:
        for _ in reader:
            pass
    assert shard.uri in str(raised.value)


def test_a_server_with_neither_etag_nor_last_modified_is_refused_at_once(versions):
    versions.last_modified = False
    versions.paths["/bare/a.bin"] = b"x" * 1000
    uri = f"{versions.origin}/bare/a.bin"
    started = time.monotonic()
    with (
        pytest.raises(ValueError, match="neither an ETag nor a Last-Modified") as raised,
        open_stream(uri, size_bytes=1000, storage_config=ALLOW) as stream,
    ):
        b"".join(stream)
    assert uri in str(raised.value)
    assert time.monotonic() - started < 5  # refused, not retried
