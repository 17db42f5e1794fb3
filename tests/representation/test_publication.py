"""The chain checked together (``representation/publication.py``): the index's claims against
the artifact manifest's inventory, each pair's inventory entries, and the task ids that join
prepared blocks to their representations.
"""

from __future__ import annotations

from typing import Any

import pytest

from representation_helpers import Inventory, broken, change_inventory, inventory_entry

pytestmark = pytest.mark.timeout(300)


def _unclaimed_object(inventory: Inventory) -> None:
    inventory["objects"].append(
        {
            "uri": "s3://syvain-data/elsewhere/notes.txt",
            "bytes": 3,
            "sha256": "cd" * 32,
            "role": "notes",
        }
    )


def _unlisted_object(inventory: Inventory) -> None:
    inventory["objects"].remove(inventory_entry(inventory, "recipe.json"))


def _change_prepared(**changes: Any) -> dict[str, Any]:
    return change_inventory(
        lambda inv: inventory_entry(inv, "task-0000.safetensors").update(changes)
    )


def _change_prepared_metadata(**changes: Any) -> dict[str, Any]:
    return change_inventory(
        lambda inv: inventory_entry(inv, "analysis-task-0000.parquet").update(changes)
    )


def _declared_rows(delta: int) -> dict[str, Any]:
    def change(inventory: Inventory) -> None:
        for tensor in inventory_entry(inventory, "analysis-task-0000.safetensors")["tensors"]:
            if tensor["name"] == "input_ids":
                tensor["shape"][0] += delta

    return change_inventory(change)


def _no_row_tensor(inventory: Inventory) -> None:
    item = inventory_entry(inventory, "analysis-task-0000.safetensors")
    item["tensors"] = [t for t in item["tensors"] if t["name"] != "input_ids"]


@pytest.mark.parametrize(
    ("hooks", "match"),
    [
        pytest.param(change_inventory(_unclaimed_object), "index does not claim", id="unclaimed"),
        pytest.param(change_inventory(_unlisted_object), "inventory does not list", id="unlisted"),
        pytest.param(_change_prepared(sha256="ee" * 32), "inventory .* SHA-256", id="claim-digest"),
        pytest.param(
            _change_prepared_metadata(bytes=123456), "inventory 123456 bytes", id="claim-size"
        ),
        pytest.param(
            change_inventory(
                lambda inv: inventory_entry(inv, "recipe.json").update(role="license")
            ),
            "the inventory 'license'",
            id="singleton-role",
        ),
        # a pair's objects
        pytest.param(_change_prepared(role="representations"), "role, source, split", id="role"),
        pytest.param(
            _change_prepared_metadata(role="representation_metadata"),
            "role, source, split",
            id="metadata-role",
        ),
        pytest.param(_change_prepared(source="longmino"), "role, source, split", id="source"),
        pytest.param(
            _change_prepared_metadata(split="validation"), "role, source, split", id="split"
        ),
        pytest.param(_declared_rows(1), "rows; the index", id="tensor-rows"),
        pytest.param(
            change_inventory(_no_row_tensor), "exactly one tensor 'input_ids'", id="no-tensor"
        ),
        pytest.param(
            change_inventory(
                lambda inv: inventory_entry(inv, "analysis-task-0000.parquet")["parquet"].update(
                    rows=7
                )
            ),
            "7 parquet rows",
            id="parquet-rows",
        ),
    ],
)
def test_claims_and_pairs_rules(builder, config, hooks, match):
    broken(builder, config, match, **hooks)


def test_task_ids_come_from_file_names(builder, config):
    task = builder.task("validation", "common_pile", 1)
    task.representation_file = "projections.safetensors"
    broken(builder, config, "must be \\{task\\}/representations.safetensors")


def test_task_sets_must_be_equal(builder, config):
    builder.task("basis_fit", "dolmino", 0).representation_folder = "another-task"
    broken(builder, config, "task sets differ")


def test_prepared_task_id_is_the_file_name(builder, config):
    # Renaming the prepared file changes its task id: the sets differ.
    builder.task("analysis", "dolmino", 1).prepared_file = "renamed.safetensors"
    broken(builder, config, "only prepared: renamed")
