"""The representation rows of the selected blocks (``representation/relations.py``): the
representation metadata's columns, and the 32 rows of every selected block at the requested
layer and state kind.
"""

from __future__ import annotations

import hashlib
from typing import Any

import pytest

from representation_fixture import PublicationBuilder
from representation_helpers import REQUEST, broken, first_relation_rows, first_selected
from representation_tasks import sha256

pytestmark = pytest.mark.timeout(300)


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
    change(first_selected(builder)[0].representation_rows)
    broken(builder, config, match)


def _extra_row(builder: PublicationBuilder) -> None:
    task, block = first_selected(builder)
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


@pytest.mark.parametrize(
    ("change", "match"),
    [
        pytest.param(
            lambda b: first_relation_rows(b)[4].update(layer=0), "has 31 rows", id="31-rows"
        ),
        pytest.param(_extra_row, "has 33 rows", id="33-rows"),
        pytest.param(
            lambda b: _shift_position(first_relation_rows(b)), "position_offset", id="position"
        ),
        pytest.param(
            lambda b: first_relation_rows(b)[0].update(source="common_pile"), "source", id="src"
        ),
        pytest.param(
            lambda b: first_relation_rows(b)[1].update(split="basis_fit"), "split", id="split"
        ),
        pytest.param(
            lambda b: first_relation_rows(b)[2].update(
                token_offset=first_relation_rows(b)[2]["token_offset"] + 64
            ),
            "token_offset",
            id="token-offset",
        ),
        pytest.param(
            lambda b: first_relation_rows(b)[5].update(block_type="sliding_attention"),
            "block_type",
            id="block-type",
        ),
        pytest.param(
            lambda b: first_relation_rows(b)[6].update(projected_position_id=sha256(b"other")),
            "projected_position_id",
            id="position-id",
        ),
        pytest.param(
            lambda b: first_relation_rows(b)[7].update(
                projection_row=len(first_selected(b)[0].representation_tensors["projection"])
            ),
            "outside",
            id="projection-row",
        ),
    ],
)
def test_representation_row_rules(builder, config, change, match):
    change(builder)
    broken(builder, config, match)


def test_block_type_of_sliding_layers(builder, config):
    task, block = first_selected(builder)
    task.relation_rows(block.block_id, 0, "residual_pre")[0]["block_type"] = "full_attention"
    broken(
        builder, config, "block_type", request={"teacher_layer": 0, "state_kind": "residual_pre"}
    )
