"""The artifact manifest's own rules (``representation/artifact_manifest.py``): its digest, its
canonical JSON, schema, version and recipe, its objects and their totals.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from representation_helpers import (
    Inventory,
    broken,
    change_inventory,
    flip_byte,
    inventory_entry,
)

pytestmark = pytest.mark.timeout(300)


def _set(**changes: Any) -> dict[str, Any]:
    return change_inventory(lambda inventory: inventory.update(changes))


def _totals(**changes: int) -> dict[str, Any]:
    def hook(inventory: Inventory) -> None:
        for key, delta in changes.items():
            inventory["totals"][key] += delta

    return {"inventory_hook": hook}


def _repeat_object(inventory: Inventory) -> None:
    inventory["objects"].append(dict(inventory_entry(inventory, "recipe.json")))


def _lists_itself(inventory: Inventory) -> None:
    recipe = inventory_entry(inventory, "recipe.json")
    inventory["objects"].append(
        {**recipe, "uri": recipe["uri"].replace("recipe.json", "artifact-manifest-v2.json")}
    )


@pytest.mark.parametrize(
    ("hooks", "match"),
    [
        pytest.param(
            {
                "upload_hook": lambda objects: objects.update(
                    {
                        uri: flip_byte(data)
                        for uri, data in objects.items()
                        if uri.endswith("artifact-manifest-v2.json")
                    }
                )
            },
            "artifact manifest's .* SHA-256",
            id="digest",
        ),
        pytest.param(
            {"inventory_bytes_hook": lambda data: json.dumps(json.loads(data), indent=1).encode()},
            "not canonical",
            id="not-canonical",
        ),
        pytest.param(
            {"inventory_bytes_hook": lambda data: data.rstrip(b"\n")}, "not canonical", id="newline"
        ),
        pytest.param(
            {
                "inventory_bytes_hook": lambda data: (
                    json.dumps(json.loads(data), sort_keys=True, separators=(",", ":")).encode()
                    + b"\n"
                )
            },
            "not canonical",
            id="ascii-escaped",
        ),
        pytest.param(_set(schema="syvain-other-manifest-v2"), "schema is", id="schema"),
        pytest.param(_set(schema_version=3), "schema_version", id="version"),
        pytest.param(_set(schema_version="2"), "schema_version", id="version-str"),
        pytest.param(_set(recipe_sha256="ef" * 32), "recipe_sha256", id="recipe"),
        pytest.param(change_inventory(_repeat_object), "more than once", id="repeated-uri"),
        pytest.param(_totals(objects=1), "totals", id="totals-objects"),
        pytest.param(_totals(bytes=-1), "totals", id="totals-bytes"),
        pytest.param(change_inventory(_lists_itself), "lists itself", id="lists-itself"),
    ],
)
def test_artifact_manifest_rules(builder, config, hooks, match):
    broken(builder, config, match, **hooks)
