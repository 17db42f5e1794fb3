"""Plain http:// (read only where the caller passes ``allow_http=True``, SPEC section 4's web
store without TLS), against a plain-HTTP server on loopback (``https_server.serve_http``)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from https_server import HttpsServer, serve_http
from resumed_reads import as_list, interrupted_and_resumed
from syvain_training_data import SyvainTrainingData
from syvain_training_data.storage import (
    StorageConfig,
    get_object,
    head_object,
    native_storage,
    open_stream,
)

RECORDS = [{"i": i, "text": "h" * (i % 89)} for i in range(300)]
ALLOW = StorageConfig(allow_http=True)
pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def server() -> Iterator[HttpsServer]:
    with serve_http() as running:
        yield running


def publish(server: HttpsServer, tmp: Path, base: str) -> str:
    """A msgpack.zstf dataset the saver wrote locally, served under ``base``: its manifest URI."""
    root = tmp / "dataset"
    saver = SyvainTrainingData().dataset_saver(
        f"file://{root}/data-manifest.json", data_format="msgpack.zstf"
    )
    for shard in range(3):
        saver.save("train", None, RECORDS[shard::3], shard_id=f"s{shard}")
    saver.commit_manifest()
    for path in root.rglob("*"):
        if path.is_file() and path.name != "data-manifest.json":
            server.paths[f"{base}/{path.relative_to(root)}"] = path.read_bytes()
    manifest = (root / "data-manifest.json").read_text()
    server.paths[f"{base}/data-manifest.json"] = manifest.replace(
        f"file://{root}", f"{server.origin}{base}"
    ).encode()
    return f"{server.origin}{base}/data-manifest.json"


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
