"""Prepared blocks, their selection and the teacher projections (``representation/blocks.py``):
metadata columns and rows, selection per source, tensor names, dtypes and shapes, and the 32
representation rows of every selected block.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from representation_fixture import PublicationBuilder, sha256
from representation_helpers import REQUEST, _selected, broken, load
from syvain_training_data import RepresentationIntegrityError

pytestmark = pytest.mark.timeout(300)


# --------------------------------------------------------------------------------------------
# Prepared metadata and selection
# --------------------------------------------------------------------------------------------


def _prepared_rows(builder: PublicationBuilder) -> list[dict[str, Any]]:
    return _selected(builder)[0].prepared_rows


@pytest.mark.parametrize(
    ("change", "match"),
    [
        pytest.param(lambda rows: [r.pop("document_id") for r in rows], "columns", id="missing"),
        pytest.param(lambda rows: [r.update(extra=1) for r in rows], "columns", id="extra"),
        pytest.param(lambda rows: rows[1].update(block_index=5), "row 1: block_index", id="index"),
        pytest.param(
            lambda rows: rows[2].update(block_id=rows[2]["block_id"].upper()),
            "row 2: block_id",
            id="block-id",
        ),
        pytest.param(lambda rows: rows[0].update(source="common_pile"), "source", id="source"),
        pytest.param(lambda rows: rows[0].update(split="validation"), "split", id="split"),
        pytest.param(lambda rows: rows[1].update(token_offset=-1), "token_offset", id="token"),
        pytest.param(lambda rows: rows[0].update(projection_offset=64), "projection_off", id="64"),
        pytest.param(lambda rows: rows[0].update(projection_offset=-1), "projection_off", id="-1"),
        pytest.param(lambda rows: rows[0].update(token_offset=None), "nulls", id="null"),
    ],
)
def test_prepared_metadata_rules(builder, config, change, match):
    change(_prepared_rows(builder))
    broken(builder, config, match)


def test_repeated_block_id_within_a_source(builder, config):
    first = builder.task("analysis", "common_pile", 0)
    second = builder.task("analysis", "common_pile", 1)
    second.prepared_rows[0]["block_id"] = first.prepared_rows[0]["block_id"]
    broken(builder, config, "appears twice among the 'common_pile' candidates")


def test_block_selected_under_two_sources(builder, config):
    for source in ("dolmino", "common_pile"):
        builder.task("analysis", source, 1).prepared_rows[2]["block_id"] = "0" * 64
    broken(builder, config, "selected under both 'dolmino' and 'common_pile'")


def test_too_few_examples_is_value_error(builder, config):
    published = builder.publish(config)
    with pytest.raises(ValueError) as info:
        load(published, config, per_source_count=7)
    assert str(info.value) == "Source 'dolmino' has 6 'analysis' examples; requested 7"
    assert not isinstance(info.value, RepresentationIntegrityError)


def test_a_source_without_blocks_has_zero_examples(builder, config):
    published = builder.publish(config)
    with pytest.raises(ValueError, match="^Source 'longmino' has 0 'analysis' examples"):
        load(published, config, sources=["longmino"])


# --------------------------------------------------------------------------------------------
# Tensors
# --------------------------------------------------------------------------------------------


def _prepared_tensors(builder: PublicationBuilder) -> dict[str, np.ndarray]:
    return _selected(builder)[0].prepared_tensors


def _projection(builder: PublicationBuilder) -> dict[str, np.ndarray]:
    return _selected(builder)[0].representation_tensors


@pytest.mark.parametrize(
    ("change", "match"),
    [
        pytest.param(
            lambda t: t.update(extra=np.zeros(3, np.int8)), "tensors must be exactly", id="extra"
        ),
        pytest.param(lambda t: t.pop("qkv_start"), "tensors must be exactly", id="missing"),
        pytest.param(
            lambda t: t.update(input_ids=t["input_ids"].astype(np.int64)), "I32", id="ids-dtype"
        ),
        pytest.param(
            lambda t: t.update(input_ids=np.ascontiguousarray(t["input_ids"][:, :1024])),
            "I32",
            id="ids-shape",
        ),
        pytest.param(
            lambda t: t.update(projection_offset=t["projection_offset"].astype(np.int32)),
            "I16",
            id="offset-dtype",
        ),
        pytest.param(
            lambda t: t["projection_offset"].__setitem__(1, (t["projection_offset"][1] + 1) % 64),
            "projection_offset\\[1\\]",
            id="offset-values",
        ),
    ],
)
def test_prepared_tensor_rules(builder, config, change, match):
    change(_prepared_tensors(builder))
    broken(builder, config, match)


@pytest.mark.parametrize(
    ("change", "match"),
    [
        pytest.param(
            lambda t: t.update(norm=np.zeros(len(t["projection"]), np.float16)),
            "exactly projection",
            id="extra",
        ),
        pytest.param(
            lambda t: t.update(projection=t["projection"].astype(np.float32)), "F16", id="dtype"
        ),
        pytest.param(
            lambda t: t.update(projection=np.ascontiguousarray(t["projection"][:, :128])),
            "F16",
            id="width",
        ),
        pytest.param(
            lambda t: t.update(projection=np.concatenate([t["projection"], t["projection"][:1]])),
            "rows",
            id="rows",
        ),
    ],
)
def test_projection_tensor_rules(builder, config, change, match):
    change(_projection(builder))
    broken(builder, config, match)


@pytest.mark.parametrize(
    ("change", "match"),
    [
        pytest.param(lambda rows: [r.pop("block_type") for r in rows], "columns", id="missing"),
        pytest.param(lambda rows: [r.update(note="x") for r in rows], "columns", id="extra"),
        pytest.param(
            lambda rows: [r.update(layer=str(r["layer"])) for r in rows], "integer", id="type"
        ),
    ],
)
def test_representation_metadata_columns(builder, config, change, match):
    change(_selected(builder)[0].representation_rows)
    broken(builder, config, match)


def _relations(builder: PublicationBuilder) -> list[dict[str, Any]]:
    """The 32 representation rows of the first selected block at the requested layer/kind."""
    task, block = _selected(builder)
    return task.relation_rows(block.block_id, REQUEST["teacher_layer"], REQUEST["state_kind"])


def _extra_row(builder: PublicationBuilder) -> None:
    task, block = _selected(builder)
    other = task.relation_rows(block.block_id, 7, REQUEST["state_kind"])
    other[5]["layer"] = REQUEST["teacher_layer"]


def _shift_position(rows: list[dict[str, Any]]) -> None:
    row = rows[3]
    row["position_offset"] += 1
    row["token_offset"] += 1
    row["projected_position_id"] = hashlib.sha256(
        "syvain-olmo3-representation-calibration-v1:projected-position\0"
        f"{row['block_id']}\0{row['position_offset']}".encode()
    ).hexdigest()


def _non_finite(value: float) -> Callable[[PublicationBuilder], None]:
    def change(builder: PublicationBuilder) -> None:
        row = _relations(builder)[9]["projection_row"]
        _projection(builder)["projection"][row, 17] = value

    return change


@pytest.mark.parametrize(
    ("change", "match"),
    [
        pytest.param(lambda b: _relations(b)[4].update(layer=0), "has 31 rows", id="31-rows"),
        pytest.param(_extra_row, "has 33 rows", id="33-rows"),
        pytest.param(lambda b: _shift_position(_relations(b)), "position_offset", id="position"),
        pytest.param(lambda b: _relations(b)[0].update(source="common_pile"), "source", id="src"),
        pytest.param(lambda b: _relations(b)[1].update(split="basis_fit"), "split", id="split"),
        pytest.param(
            lambda b: _relations(b)[2].update(token_offset=_relations(b)[2]["token_offset"] + 64),
            "token_offset",
            id="token-offset",
        ),
        pytest.param(
            lambda b: _relations(b)[5].update(block_type="sliding_attention"),
            "block_type",
            id="block-type",
        ),
        pytest.param(
            lambda b: _relations(b)[6].update(projected_position_id=sha256(b"other")),
            "projected_position_id",
            id="position-id",
        ),
        pytest.param(
            lambda b: _relations(b)[7].update(projection_row=len(_projection(b)["projection"])),
            "outside",
            id="projection-row",
        ),
        pytest.param(_non_finite(float("nan")), "not finite", id="nan"),
        pytest.param(_non_finite(float("inf")), "not finite", id="inf"),
        pytest.param(_non_finite(float("-inf")), "not finite", id="-inf"),
    ],
)
def test_representation_row_rules(builder, config, change, match):
    change(builder)
    broken(builder, config, match)


def test_block_type_of_sliding_layers(builder, config):
    task, block = _selected(builder)
    task.relation_rows(block.block_id, 0, "residual_pre")[0]["block_type"] = "full_attention"
    broken(
        builder, config, "block_type", request={"teacher_layer": 0, "state_kind": "residual_pre"}
    )


def test_declared_shapes_must_be_the_files(builder, config):
    def hook(objects: dict[str, bytes]) -> None:
        # Same claims, other bytes: a file whose header disagrees with the inventory.
        task, _ = _selected(builder)
        from safetensors.numpy import save

        tensors = dict(task.prepared_tensors)
        tensors["qkv_start"] = np.zeros(len(tensors["qkv_start"]) + 1, np.int32)
        objects[task.prepared_uri] = save(tensors)

    broken(builder, config, "qkv_start has shape", objects_hook=hook)


def test_unreadable_safetensors(builder, config):
    task, _ = _selected(builder)
    broken(
        builder,
        config,
        "unreadable safetensors",
        objects_hook=lambda objects: objects.update({task.representation_uri: b"\xff" * 64}),
    )
