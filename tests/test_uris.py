"""The one URI module (SPEC section 4): parsing, bucket names, the untrusted-manifest scheme
rule and local etags, and the manifest model's use of them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from syvain_training_data.manifest import parse_manifest
from syvain_training_data.uris import (
    bucket_key,
    check_bucket_name,
    check_shard_scheme,
    check_uri,
    file_path,
    https_host_path,
    hub_path,
    plain_etag,
    portable_etag,
    s3_bucket_key,
)

# Every character SPEC section 4 forbids in a bucket name, at the start, middle and end.
BAD_BUCKET_CHARACTERS = [
    "/",
    "?",
    "#",
    "@",
    ":",
    "%",
    " ",
    "\t",
    "\n",
    "\r",
    "\x00",
    "\x7f",
    "\x85",
]


# The table the Rust store is tested against too (`cargo test -p syvain-core`).
URI_RULES = json.loads((Path(__file__).parent / "uri_rules.json").read_text("utf-8"))


def manifest_bytes(shard_uri: str) -> bytes:
    shard = {"uri": shard_uri, "records": 1, "size_bytes": 1, "etag": ""}
    document = {
        "version": 1,
        "data_format": "jsonl.gz",
        "splits": {"train": {"records": 1, "shards": [shard], "curriculum": {}}},
    }
    return json.dumps(document).encode()


def test_s3_and_file_uris_parse() -> None:
    assert s3_bucket_key("s3://bucket-1.x/a/b%2Fc") == ("bucket-1.x", "a/b%2Fc")
    assert file_path("file:///data/x.parquet") == "/data/x.parquet"
    assert check_uri("file:///x") == "file:///x"
    for bad in ["s3://bucket", "s3://bucket/", "s3:///key", "S3://b/k", "ftp://b/k"]:
        with pytest.raises(ValueError):
            check_uri(bad)
    for bad in ["file:///", "file://host/path", "file:/path", "file:relative"]:
        with pytest.raises(ValueError, match="file:///absolute/path"):
            check_uri(bad)


@pytest.mark.parametrize("case", URI_RULES["valid"], ids=lambda case: case["uri"])
def test_the_shared_table_of_valid_uris(case) -> None:
    uri = case["uri"]
    assert check_uri(uri) == uri
    if "path" in case:
        assert file_path(uri) == case["path"]
    elif "origin" in case:
        netloc, path = https_host_path(uri)
        scheme = uri.partition("://")[0]
        assert (f"{scheme}://{netloc}", path) == (case["origin"], case["http_path"])
    elif "gs_bucket" in case:
        assert bucket_key(uri, "gs://") == (case["gs_bucket"], case["key"])
    elif "hub_path" in case:
        assert case["hub_path"].endswith("/" + hub_path(uri))
    else:
        assert s3_bucket_key(uri) == (case["bucket"], case["key"])
    assert parse_manifest(manifest_bytes(uri), "m").splits["train"].shards[0].uri == uri


@pytest.mark.parametrize("case", URI_RULES["invalid"], ids=lambda case: repr(case["uri"]))
def test_the_shared_table_of_invalid_uris(case) -> None:
    uri = case["uri"]
    with pytest.raises(ValueError):
        check_uri(uri)
    with pytest.raises(ValueError, match=r"^Data manifest has invalid shape: m\n") as info:
        parse_manifest(manifest_bytes(uri), "m")
    assert "shard URI must be s3://bucket/key" in str(info.value)


@pytest.mark.parametrize(
    ("uri", "problem"),
    [
        ("s3://b/a//c", "the key holds an empty, '.' or '..' segment"),
        ("s3://b/a/../c", "the key holds an empty, '.' or '..' segment"),
        ("s3://b/prefix/", "an object key may not end in '/'"),
        ("s3://b/a\x01", "the key holds a control character"),
        (
            "s3://a[b]/k",
            "the bucket name 'a[b]' holds '['; bucket names may hold only letters, "
            "digits, '.', '-' and '_'",
        ),
        ("s3://é/k", "the bucket name 'é' holds 'é'"),
        ("file:///data/../etc/passwd", "the path holds an empty, '.' or '..' segment"),
        ("file:////x", "the path holds an empty, '.' or '..' segment"),
        ("file:///data/", "an object path may not end in '/'"),
        ("file:///data/x\x01", "the path holds a control character"),
    ],
)
def test_a_uri_the_store_would_refuse_is_named_with_its_problem(uri, problem) -> None:
    with pytest.raises(ValueError) as info:
        check_uri(uri)
    assert str(info.value).startswith(f"{uri!r} is not a valid ")
    assert problem in str(info.value)
    with pytest.raises(ValueError) as info:
        parse_manifest(manifest_bytes(uri), "m")
    assert f"{uri!r} is not a valid " in str(info.value) and problem in str(info.value)


def test_bucket_names_hold_only_letters_digits_dots_dashes_and_underscores() -> None:
    assert check_bucket_name("my-data.v2_X") == "my-data.v2_X"
    for bucket in ["a\\b", "a[b]", "é", "a+b", "a!b"]:
        with pytest.raises(ValueError, match="bucket names may hold only letters, digits"):
            check_bucket_name(bucket)


@pytest.mark.parametrize("character", BAD_BUCKET_CHARACTERS)
@pytest.mark.parametrize("where", ["start", "middle", "end"])
def test_bucket_names_that_could_change_the_request_are_rejected(character, where) -> None:
    bucket = {"start": f"{character}bucket", "middle": f"buc{character}ket"}.get(
        where, f"bucket{character}"
    )
    with pytest.raises(ValueError, match="bucket name"):
        check_bucket_name(bucket)
    if character != "/":  # a slash ends the bucket: the URI names another bucket and key
        with pytest.raises(ValueError, match="bucket name"):
            s3_bucket_key(f"s3://{bucket}/key")


@pytest.mark.parametrize("character", [c for c in BAD_BUCKET_CHARACTERS if c != "/"])
def test_manifest_with_a_bad_bucket_name_has_invalid_shape(character) -> None:
    uri = f"s3://evil{character}host.example/key"
    with pytest.raises(ValueError, match=r"^Data manifest has invalid shape: s3://m/k\n") as info:
        parse_manifest(manifest_bytes(uri), "s3://m/k")
    assert "bucket name" in str(info.value)


@pytest.mark.parametrize("uri", ["file://host/etc/passwd", "file:etc/passwd", "file:///"])
def test_manifest_file_shard_must_be_absolute(uri) -> None:
    with pytest.raises(ValueError, match="Data manifest has invalid shape"):
        parse_manifest(manifest_bytes(uri), "file:///m.json")


def test_manifest_accepts_ordinary_buckets_and_paths() -> None:
    for uri in ["s3://my-bucket.v2/k/é", "file:///tmp/x y/part.parquet"]:
        assert parse_manifest(manifest_bytes(uri), "m").splits["train"].shards[0].uri == uri


@pytest.mark.parametrize(
    ("manifest", "shard"),
    [
        ("s3://bucket/m.json", "file:///etc/passwd"),
        ("file:///data/m.json", "s3://bucket/key"),
    ],
)
def test_shard_scheme_is_confined_to_the_manifest_scheme(manifest, shard) -> None:
    with pytest.raises(ValueError) as info:
        check_shard_scheme(manifest, shard)
    assert manifest in str(info.value) and shard in str(info.value)
    assert "allow_mixed_schemes=True" in str(info.value)
    check_shard_scheme(manifest, shard, allow_mixed_schemes=True)


def test_same_scheme_shards_pass() -> None:
    check_shard_scheme("s3://a/m.json", "s3://other-bucket/k")
    check_shard_scheme("file:///a/m.json", "file:///elsewhere/k")


def test_etag_rules() -> None:
    assert plain_etag(' W/"abc" ') == "abc"
    assert portable_etag("file:///x", "12345-67890") == ""
    assert portable_etag("s3://b/k", '"abc"') == '"abc"'
