"""A completion descriptor is read as strict ASCII JSON, like a manifest: anything else is a
PublicationConflictError naming the descriptor and the reason."""

from __future__ import annotations

import pytest

from syvain_training_data.errors import PublicationConflictError
from syvain_training_data.publish.descriptor import loads_descriptor

URI = "s3://bucket/shards/train/part.msgpack.zstf.metadata.json"


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b'{"schema": 1, "schema": 2}', "duplicate object key 'schema'"),
        (b'{"records": NaN}', "NaN is not a JSON number"),
        (b'{"records": 1e999}', "number 1e999 is out of range"),
        ('{"shard": "\u00e9"}'.encode(), "ascii"),
        (b'{"records": ', "Expecting value"),
    ],
)
def test_descriptor_that_is_not_strict_ascii_json_is_a_conflict(data, reason) -> None:
    with pytest.raises(PublicationConflictError) as raised:
        loads_descriptor(data, URI)
    message = str(raised.value)
    assert message.startswith(f"Completion descriptor {URI} is not valid ASCII JSON: ")
    assert reason in message


def test_strict_ascii_json_is_read() -> None:
    assert loads_descriptor(b'{"records": 3, "sha256": "ab"}', URI) == {
        "records": 3,
        "sha256": "ab",
    }
