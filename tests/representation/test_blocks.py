"""Prepared blocks and their selection (``representation/blocks.py``): the prepared metadata's
columns and rows, and the choice of blocks per source.
"""

from __future__ import annotations

from typing import Any

import pytest

from representation_fixture import PublicationBuilder
from representation_helpers import broken, first_selected, load
from syvain_training_data import RepresentationIntegrityError

pytestmark = pytest.mark.timeout(300)


def _prepared_rows(builder: PublicationBuilder) -> list[dict[str, Any]]:
    return first_selected(builder)[0].prepared_rows


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
