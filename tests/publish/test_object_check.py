"""The shared object checks of publication on the local store: HEAD, then size, then etag
(object_check.check_head), and the create-only rule (upload.create_or_match)."""

from __future__ import annotations

import pytest

from syvain_training_data import PublicationConflictError, object_check, storage
from syvain_training_data.object_check import Mismatch, check_head
from syvain_training_data.publish.upload import create_or_match
from syvain_training_data.storage import ObjectInfo, StorageConfig

CONFIG = StorageConfig()


@pytest.fixture
def local_object(tmp_path) -> str:
    uri = f"file://{tmp_path}/objects/a.bin"
    storage.put_object(uri, b"0123456789", storage_config=CONFIG)
    return uri


def test_a_missing_object_is_file_not_found(tmp_path) -> None:
    with pytest.raises(FileNotFoundError):
        check_head(f"file://{tmp_path}/nothing.bin", CONFIG, size=1)


def test_the_size_is_compared_first(local_object) -> None:
    check = check_head(local_object, CONFIG, size=11, etag="not-its-etag")
    assert check.mismatch == Mismatch("size", 10, 11)
    assert check.info.size == 10 and not check.etag_compared


def test_no_claim_is_no_mismatch(local_object) -> None:
    check = check_head(local_object, CONFIG)
    assert check.mismatch is None and not check.etag_compared
    assert check_head(local_object, CONFIG, size=10, etag="").mismatch is None


def test_a_local_objects_etag_is_never_held_against_a_claim(local_object) -> None:
    info = storage.head_object(local_object, storage_config=CONFIG)
    check = check_head(local_object, CONFIG, size=10, etag=info.etag + "-replaced")
    assert check.mismatch is None and not check.etag_compared


@pytest.mark.parametrize(
    ("store_etag", "claimed", "mismatch"),
    [
        ('"abc"', "abc", None),
        ("abc", 'W/"abc"', None),
        ('"abc"', '"abd"', Mismatch("etag", '"abc"', '"abd"')),
    ],
)
def test_etags_compare_without_quotes(monkeypatch, store_etag, claimed, mismatch) -> None:
    uri = "s3://bucket/key"

    def head(found: str, *, storage_config: StorageConfig) -> ObjectInfo:
        return ObjectInfo(uri=found, size=10, etag=store_etag)

    monkeypatch.setattr(object_check, "head_object", head)
    check = check_head(uri, CONFIG, size=10, etag=claimed)
    assert check.mismatch == mismatch and check.etag_compared


def test_an_etag_the_store_does_not_give_is_not_compared(monkeypatch) -> None:
    def head(found: str, *, storage_config: StorageConfig) -> ObjectInfo:
        return ObjectInfo(uri=found, size=10, etag="")

    monkeypatch.setattr(object_check, "head_object", head)
    check = check_head("s3://bucket/key", CONFIG, size=10, etag='"abc"')
    assert check.mismatch is None and not check.etag_compared


def test_create_or_match_creates_then_accepts_the_same_bytes(tmp_path) -> None:
    uri = f"file://{tmp_path}/d.json"
    assert create_or_match(uri, b"{}", CONFIG, conflict="Thing") is True
    assert create_or_match(uri, b"{}", CONFIG, conflict="Thing") is False
    with pytest.raises(PublicationConflictError) as raised:
        create_or_match(uri, b"[]", CONFIG, conflict="Thing")
    assert str(raised.value) == f"Thing {uri} already exists with different bytes"
    assert storage.get_object(uri, storage_config=CONFIG) == b"{}"


def test_create_or_match_hooks(tmp_path) -> None:
    uri = f"file://{tmp_path}/d.json"
    create_or_match(uri, b"{}", CONFIG, conflict="Thing")
    asked: list[str] = []

    def equivalent() -> bool:
        asked.append(uri)
        return True

    assert create_or_match(uri, b"{ }", CONFIG, matches=equivalent, conflict="Thing") is False
    assert asked == [uri]
    with pytest.raises(FileExistsError, match="other content"):
        create_or_match(
            uri,
            b"[]",
            CONFIG,
            matches=lambda: False,
            conflict=lambda: FileExistsError(f"{uri} already exists with other content"),
        )


def test_create_or_match_with_its_own_upload(tmp_path) -> None:
    uri = f"file://{tmp_path}/d.bin"
    uploads: list[int] = []

    def upload() -> None:
        uploads.append(1)
        storage.put_object(uri, b"data", storage_config=CONFIG, create_only=True)

    assert create_or_match(uri, upload, CONFIG, matches=lambda: True, conflict="Thing") is True
    assert create_or_match(uri, upload, CONFIG, matches=lambda: True, conflict="Thing") is False
    with pytest.raises(PublicationConflictError, match="Thing"):
        create_or_match(uri, upload, CONFIG, matches=lambda: False, conflict="Thing")
    assert len(uploads) == 3
