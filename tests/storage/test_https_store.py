"""The read-only https:// and hf:// stores (SPEC section 4, v2) against a real TLS server on
loopback (``https_server``): datasets in all three formats load, mix and resume as from s3://;
the version is held by ETag; a server without ETags or Range is refused clearly, never retried;
writes are refused; a manifest from the web names shards on its own host only; the Hub's
resolve URLs, its redirect to a CDN, gated repositories and ``HF_TOKEN`` (never shown)."""

from __future__ import annotations

import pickle
import time
from collections.abc import Iterator
from multiprocessing.reduction import ForkingPickler
from pathlib import Path
from typing import Any

import pytest

from https_server import HttpsServer, serve_dataset, serve_https
from resumed_reads import interrupted_and_resumed
from syvain_training_data import SyvainTrainingData, iter_shard
from syvain_training_data.errors import ObjectChangedError
from syvain_training_data.storage import (
    StorageConfig,
    get_object,
    head_object,
    native_storage,
    open_stream,
    put_object,
)

FORMATS = ["msgpack.zstf", "jsonl.gz", "parquet"]
RECORDS = [{"i": i, "text": "w" * (i % 97)} for i in range(400)]
HUB_TOKEN = "hf_secret_token_for_tests_only"


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[HttpsServer]:
    with pytest.MonkeyPatch.context() as patch:
        folder = tmp_path_factory.mktemp("tls")
        with serve_https(folder) as running:
            patch.setenv("SSL_CERT_FILE", str(folder / "ca.pem"))
            yield running


def publish(server: HttpsServer, tmp: Path, data_format: str, base: str) -> str:
    return serve_dataset(server, tmp, RECORDS, data_format, base)


def as_list(batch: list[Any]) -> list[Any]:
    return batch


@pytest.mark.parametrize("data_format", FORMATS)
def test_a_dataset_on_a_web_server_loads_mixes_and_resumes(server, tmp_path, data_format):
    uri = publish(server, tmp_path, data_format, f"/web/{data_format}")
    client = SyvainTrainingData()
    manifest = client.load_manifest(uri)
    shards = manifest.splits["train"].shards
    assert [r["i"] for r in iter_shard(data_format, shards[1])] == [r["i"] for r in RECORDS[1::3]]
    seen = interrupted_and_resumed(client, uri, "i", seed=4, batches_before=10)
    assert sorted(seen) == list(range(len(RECORDS)))


def test_reads_are_held_to_the_etag_the_server_gave(server):
    server.paths["/pin/a.bin"] = bytes(range(256)) * 64
    uri = f"{server.origin}/pin/a.bin"
    info = head_object(uri)
    assert info.size == 256 * 64 and info.etag == server.etag("/pin/a.bin")
    assert get_object(uri) == server.paths["/pin/a.bin"]
    server.paths["/pin/a.bin"] = bytes(256 * 64)  # replaced in place, same size
    with (
        pytest.raises(ObjectChangedError, match=uri),
        open_stream(uri, size_bytes=info.size, etag=info.etag) as stream,
    ):
        b"".join(stream)


def test_a_server_without_etags_or_dates_is_refused_at_once(server, tmp_path):
    server.paths["/plain/a.bin"] = b"x" * 1000
    server.etags = server.last_modified = False
    try:
        started = time.monotonic()
        with (
            pytest.raises(ValueError, match="neither an ETag nor a Last-Modified") as raised,
            open_stream(f"{server.origin}/plain/a.bin", size_bytes=1000) as stream,
        ):
            b"".join(stream)
        assert f"{server.origin}/plain/a.bin" in str(raised.value)
        assert time.monotonic() - started < 5  # refused, not retried
    finally:
        server.etags = server.last_modified = True


def test_a_server_that_ignores_range_serves_whole_reads_and_refuses_resumed_ones(server):
    server.paths["/norange/a.bin"] = bytes(range(200)) * 10
    uri = f"{server.origin}/norange/a.bin"
    server.ranges = False
    try:
        with open_stream(uri, size_bytes=2000) as stream:
            assert b"".join(stream) == server.paths["/norange/a.bin"]
        started = time.monotonic()
        with (
            pytest.raises(RuntimeError, match="Range") as raised,
            open_stream(uri, size_bytes=2000, start=500) as stream,
        ):
            b"".join(stream)
        assert uri in str(raised.value)
        assert time.monotonic() - started < 5
    finally:
        server.ranges = True


@pytest.mark.parametrize(
    "uri", ["https://127.0.0.1:1/x/a.json", "hf://datasets/owner/name@main/a.json"]
)
def test_writes_are_refused_before_any_request(uri):
    with pytest.raises(ValueError, match="read-only"):
        put_object(uri, b"{}")
    with pytest.raises(ValueError, match="read-only"):
        SyvainTrainingData().dataset_saver(uri.replace("a.json", "m.json")).save(
            "train", None, [{"i": 1}]
        )


def test_a_manifest_from_the_web_names_shards_on_its_own_host_only(server, tmp_path):
    uri = publish(server, tmp_path, "jsonl.gz", "/elsewhere")
    body = server.paths["/elsewhere/data-manifest.json"].decode()
    for other in ("https://127.0.0.2:9", "https://localhost:" + str(server.port)):
        server.paths["/elsewhere/bad.json"] = body.replace(server.origin, other).encode()
        bad = f"{server.origin}/elsewhere/bad.json"
        loader = SyvainTrainingData().split_data_loader(bad, as_list, {"batch_size": 4})
        with pytest.raises(ValueError, match="may name only shards on that host"):
            list(loader.load("train"))
    local = body.replace(f"{server.origin}/elsewhere", f"file://{tmp_path}/jsonl.gz")
    server.paths["/elsewhere/local.json"] = local.encode()
    loader = SyvainTrainingData().split_data_loader(
        f"{server.origin}/elsewhere/local.json", as_list, {"batch_size": 4}
    )
    with pytest.raises(ValueError, match="may name only https:// shards"):
        list(loader.load("train"))
    trusted = SyvainTrainingData().split_data_loader(
        f"{server.origin}/elsewhere/local.json",
        as_list,
        {"batch_size": 4},
        allow_mixed_schemes=True,
    )
    assert sum(len(batch) for batch in trusted.load("train")) == len(RECORDS)
    assert uri.endswith("/elsewhere/data-manifest.json")


@pytest.fixture()
def hub(server, monkeypatch) -> HttpsServer:
    monkeypatch.setenv("HF_ENDPOINT", server.origin)
    monkeypatch.setenv("HF_TOKEN", HUB_TOKEN)
    return server


def test_hub_datasets_load_through_resolve_urls_and_the_cdn_redirect(hub, tmp_path):
    # A dataset as files in a Hub repository, its manifest naming hf:// shards; the resolve
    # URL redirects to a CDN on another host (here: the same server as "localhost"), as the
    # Hub does.
    served = publish(hub, tmp_path, "parquet", "/datasets/org/corpus/resolve/v1")
    for path in [p for p in hub.paths if p.startswith("/datasets/org/corpus/resolve/v1/")]:
        cdn = "/cdn/" + path.rsplit("/", 1)[1]
        hub.paths[cdn] = hub.paths[path]
        if path.endswith(".parquet"):
            hub.redirects[path] = f"https://localhost:{hub.port}{cdn}"
    manifest = hub.paths["/datasets/org/corpus/resolve/v1/data-manifest.json"].decode()
    manifest = manifest.replace(
        f"{hub.origin}/datasets/org/corpus/resolve/v1", "hf://datasets/org/corpus@v1"
    )
    hub.paths["/datasets/org/corpus/resolve/v1/data-manifest.json"] = manifest.encode()
    hub.tokens["/datasets/org/corpus/"] = HUB_TOKEN  # a gated repository
    client = SyvainTrainingData()
    uri = "hf://datasets/org/corpus@v1/data-manifest.json"
    loader = client.split_data_loader(uri, as_list, {"batch_size": 8}).load("train", seed=2)
    assert sorted(r["i"] for batch in loader for r in batch) == list(range(len(RECORDS)))
    assert served.startswith(hub.origin)
    # The token went to the Hub, never to the CDN.
    cdn = [headers for method, path, headers in hub.requests if path.startswith("/cdn/")]
    assert cdn and all("authorization" not in map(str.lower, headers) for headers in cdn)
    resolve = [h for _, path, h in hub.requests if path.startswith("/datasets/org/corpus/")]
    assert resolve and all("authorization" in map(str.lower, h) for h in resolve)


def test_a_gated_repository_without_the_token_fails_at_once_and_never_shows_it(hub, monkeypatch):
    hub.paths["/datasets/org/gated/resolve/main/a.json"] = b"{}"
    hub.tokens["/datasets/org/gated/"] = "another-token"
    started = time.monotonic()
    with pytest.raises(PermissionError) as raised:
        get_object("hf://datasets/org/gated/a.json")
    assert time.monotonic() - started < 5
    assert HUB_TOKEN not in str(raised.value) and HUB_TOKEN not in repr(raised.value)
    monkeypatch.delenv("HF_TOKEN")
    with pytest.raises(PermissionError):
        get_object("hf://datasets/org/gated/a.json")


EXPLICIT_TOKEN = "hf_explicit_token_for_tests_only"


def test_an_explicit_hub_token_opens_a_gated_repository_and_wins(hub, monkeypatch):
    # A gated file whose resolve URL redirects to the CDN (another host, as the Hub's does).
    hub.paths["/datasets/org/private/resolve/main/a.json"] = b'{"a":1}'
    hub.paths["/cdn/private-b.json"] = b'{"b":2}'
    hub.paths["/datasets/org/private/resolve/main/b.json"] = b"unused"
    hub.redirects["/datasets/org/private/resolve/main/b.json"] = (
        f"https://localhost:{hub.port}/cdn/private-b.json"
    )
    hub.tokens["/datasets/org/private/"] = EXPLICIT_TOKEN
    client = SyvainTrainingData(hf_token=EXPLICIT_TOKEN)
    config = client.storage_config
    # HF_TOKEN holds another (wrong) token: the explicit one wins.
    assert get_object("hf://datasets/org/private/a.json", storage_config=config) == b'{"a":1}'
    hub.requests.clear()
    assert get_object("hf://datasets/org/private/b.json", storage_config=config) == b'{"b":2}'
    sent = {
        path: next((v for k, v in headers.items() if k.lower() == "authorization"), None)
        for _, path, headers in hub.requests
    }
    assert sent["/datasets/org/private/resolve/main/b.json"] == f"Bearer {EXPLICIT_TOKEN}"
    assert sent["/cdn/private-b.json"] is None  # dropped on the redirect to another host
    with pytest.raises(PermissionError):
        get_object("hf://datasets/org/private/a.json")  # HF_TOKEN's is not the gate's
    monkeypatch.delenv("HF_TOKEN")
    native_storage.cache_clear()
    assert get_object("hf://datasets/org/private/a.json", storage_config=config) == b'{"a":1}'


def test_the_hub_token_never_shows(hub, monkeypatch):
    hub.paths["/datasets/org/shut/resolve/main/a.json"] = b"{}"
    hub.tokens["/datasets/org/shut/"] = "the-gate-wants-another"
    client = SyvainTrainingData(hf_token=EXPLICIT_TOKEN)
    config = client.storage_config
    with pytest.raises(PermissionError) as raised:
        get_object("hf://datasets/org/shut/a.json", storage_config=config)
    shown = [
        str(raised.value),
        repr(raised.value),
        repr(client),
        repr(config),
        str(config),
        repr(native_storage(config)),
        str(client.__dict__),
    ]
    assert all(EXPLICIT_TOKEN not in text for text in shown)
    assert "hf_token=***" in repr(client) and "hf_token=***" in repr(native_storage(config))
    # A plain pickle holds no token; unpickled, it takes HF_TOKEN of its process, or fails
    # clearly when there is none.
    pickled = pickle.dumps(config)
    assert EXPLICIT_TOKEN.encode() not in pickled
    assert pickle.loads(pickled).hf_token.get_secret_value() == HUB_TOKEN
    monkeypatch.delenv("HF_TOKEN")
    without = pickle.loads(pickled)
    with pytest.raises(ValueError, match="HF_TOKEN") as withheld:
        get_object("hf://datasets/org/shut/a.json", storage_config=without)
    assert EXPLICIT_TOKEN not in str(withheld.value)
    # multiprocessing's pickler carries it to worker processes (a withheld one stays withheld).
    assert EXPLICIT_TOKEN.encode() in bytes(ForkingPickler.dumps(config))
    assert EXPLICIT_TOKEN.encode() not in bytes(ForkingPickler.dumps(without))
    assert pickle.loads(ForkingPickler.dumps(without))._hf_token_withheld
    kept = StorageConfig.create(hf_token=EXPLICIT_TOKEN, picklable_secret=True)
    assert pickle.loads(pickle.dumps(kept)).hf_token.get_secret_value() == EXPLICIT_TOKEN
    with pytest.raises(ValueError, match="hf_token is empty"):
        SyvainTrainingData(hf_token="")
