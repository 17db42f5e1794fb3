"""Helpers shared by the representation tests: the request every test starts from, loading a
publication with it, comparing the examples with the builder's data, and publishing with one
rule broken.

A plain module (``from representation_helpers import ...``); ``conftest.py`` in this directory
puts the directory on ``sys.path``, as ``tests/conftest.py`` does for ``tests/``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

from representation_fixture import PublicationBuilder, Published
from representation_tasks import Task
from syvain_training_data import RepresentationExample, RepresentationIntegrityError
from syvain_training_data.representation import iter_representation_examples
from syvain_training_data.storage import StorageConfig

REQUEST: dict[str, Any] = {
    "split": "analysis",
    "sources": ["dolmino", "common_pile"],
    "per_source_count": 4,
    "teacher_layer": 3,
    "state_kind": "post_attention",
}
FAKE_URI = (
    "s3://syvain-data/shared-data/distill-olmo3-representation-v1/"
    + "ab" * 32
    + "/publication-v2/data-manifest-v1.json"
)


def load(published: Published, config: StorageConfig, **overrides: Any) -> list[Any]:
    request = {**REQUEST, **overrides}
    return list(
        iter_representation_examples(
            published.manifest_uri,
            published.manifest_sha256,
            storage_config=config,
            **request,
        )
    )


def assert_examples(examples: list[Any], builder: PublicationBuilder, **overrides: Any) -> None:
    request = {**REQUEST, **overrides}
    expected = builder.expected(
        request["split"],
        request["sources"],
        request["per_source_count"],
        request["teacher_layer"],
        request["state_kind"],
    )
    assert [(e.block_id, e.source, e.split) for e in examples] == [
        (x.block_id, x.source, x.split) for x in expected
    ]
    for example, want in zip(examples, expected, strict=True):
        assert isinstance(example, RepresentationExample)
        assert example.input_ids.dtype == torch.int64
        assert example.input_ids.shape == (2048,)
        assert example.relation_positions.dtype == torch.int64
        assert example.relation_positions.shape == (32,)
        assert example.teacher_final_state_projections.dtype == torch.float16
        assert example.teacher_final_state_projections.shape == (32, 256)
        assert np.array_equal(example.input_ids.numpy(), want.input_ids)
        assert np.array_equal(example.relation_positions.numpy(), want.relation_positions)
        assert np.array_equal(example.teacher_final_state_projections.numpy(), want.projections)


def broken(
    builder: PublicationBuilder,
    config: StorageConfig,
    match: str,
    *,
    error: type[BaseException] = RepresentationIntegrityError,
    request: dict[str, Any] | None = None,
    **hooks: Any,
) -> BaseException:
    """Publishes with the hooks and asserts that loading raises ``error`` matching ``match``."""
    published = builder.publish(config, **hooks)
    with pytest.raises(error, match=match) as info:
        load(published, config, **(request or {}))
    return info.value


def first_selected(builder: PublicationBuilder, source: str = "dolmino") -> tuple[Task, Any]:
    """The first selected block of a source (and its task)."""
    return builder.candidates("analysis", source)[0]


def first_relation_rows(builder: PublicationBuilder) -> list[dict[str, Any]]:
    """The 32 representation rows of the first selected block at the requested layer/kind."""
    task, block = first_selected(builder)
    return task.relation_rows(block.block_id, REQUEST["teacher_layer"], REQUEST["state_kind"])


def flip_byte(data: bytes, index: int = -2) -> bytes:
    changed = bytearray(data)
    changed[index] ^= 0x01
    return bytes(changed)


# --------------------------------------------------------------------------------------------
# Artifact manifest hooks (``PublicationBuilder.publish(inventory_hook=...)``)
# --------------------------------------------------------------------------------------------


Inventory = dict[str, Any]


def inventory_entry(inventory: Inventory, suffix: str) -> dict[str, Any]:
    """The inventory object whose URI ends in ``suffix``."""
    return next(item for item in inventory["objects"] if item["uri"].endswith(suffix))


def change_inventory(change: Callable[[Inventory], None]) -> dict[str, Any]:
    """Publish hooks applying ``change`` and then fixing the totals, so only the rule under
    test breaks."""

    def hook(inventory: Inventory) -> None:
        change(inventory)
        inventory["totals"] = {
            "objects": len(inventory["objects"]),
            "bytes": sum(item["bytes"] for item in inventory["objects"]),
        }

    return {"inventory_hook": hook}
