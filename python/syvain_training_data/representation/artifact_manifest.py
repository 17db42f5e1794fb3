"""The artifact manifest (SPEC section 7): the publication's inventory of every artifact, with
its size, SHA-256, role, and the tensor shapes or parquet row count it declares.

It is pinned by its index claim. Every rule failure raises :class:`RepresentationIntegrityError`
naming the manifest, and the object entry where there is one.

Decisions where the SPEC is silent: the artifact manifest may hold keys the SPEC does not name
(at the top level, in objects, tensors and parquet entries); the named ones must be present
with the right JSON types. It must not list itself (it cannot hold its own digest).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Final, NoReturn

from syvain_training_data.errors import RepresentationIntegrityError
from syvain_training_data.representation.custody import Claim, integrity_error
from syvain_training_data.representation.layout import is_count
from syvain_training_data.strict_json import loads_strict_json

__all__ = ["ARTIFACT_MANIFEST_SCHEMA", "InventoryObject", "check_artifact_manifest"]

ARTIFACT_MANIFEST_SCHEMA: Final = "syvain-distill-olmo3-representation-artifact-manifest-v2"


def _parse_artifact_manifest(data: bytes, uri: str) -> dict[str, Any]:
    try:
        value = loads_strict_json(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as error:
        raise RepresentationIntegrityError(
            f"{uri}: the artifact manifest is not valid JSON: {error}"
        ) from error
    canonical = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    if (canonical + "\n").encode("utf-8") != data:
        integrity_error(
            uri,
            "the artifact manifest is not canonical JSON (sorted keys, separators ',' and ':', "
            "non-ASCII kept, one final newline)",
        )
    if type(value) is not dict:
        integrity_error(uri, "the artifact manifest is not a JSON object")
    return value


@dataclass(frozen=True)
class InventoryObject:
    uri: str
    size: int
    sha256: str
    role: str
    source: str | None
    split: str | None
    tensors: tuple[tuple[str, tuple[int, ...]], ...] | None
    parquet_rows: int | None


def _inventory_object(uri: str, number: int, entry: object) -> InventoryObject:
    where = f"{uri} objects[{number}]"

    def fail(message: str) -> NoReturn:
        raise RepresentationIntegrityError(f"{where}: {message}")

    if type(entry) is not dict:
        fail("is not a JSON object")
    item: dict[str, Any] = entry
    for name, kind in (("uri", str), ("bytes", int), ("sha256", str), ("role", str)):
        if type(item.get(name)) is not kind:
            fail(f"{name} must be a {kind.__name__}, got {item.get(name)!r}")
    for name in ("source", "split"):
        if name in item and type(item[name]) is not str:
            fail(f"{name} must be a str, got {item[name]!r}")
    tensors = None
    if "tensors" in item:
        if type(item["tensors"]) is not list:
            fail("tensors must be a list")
        described = []
        for tensor in item["tensors"]:
            if type(tensor) is not dict or type(tensor.get("name")) is not str:
                fail(f"a tensors entry must be an object with a str name: {tensor!r}")
            shape = tensor.get("shape")
            if type(shape) is not list or not all(is_count(d) and d >= 0 for d in shape):
                fail(f"tensor {tensor['name']!r} has an invalid shape {shape!r}")
            described.append((str(tensor["name"]), tuple(int(d) for d in shape)))
        tensors = tuple(described)
    parquet_rows = None
    if "parquet" in item:
        parquet = item["parquet"]
        if type(parquet) is not dict or not is_count(parquet.get("rows")) or parquet["rows"] < 0:
            fail(f"parquet must be an object with a non-negative int rows: {parquet!r}")
        parquet_rows = int(parquet["rows"])
    return InventoryObject(
        uri=item["uri"],
        size=item["bytes"],
        sha256=item["sha256"],
        role=item["role"],
        source=item.get("source"),
        split=item.get("split"),
        tensors=tensors,
        parquet_rows=parquet_rows,
    )


def check_artifact_manifest(
    data: bytes, claim: Claim, recipe_sha256: str
) -> dict[str, InventoryObject]:
    """The inventory by URI, after the artifact manifest's own rules."""
    uri = claim.uri
    value = _parse_artifact_manifest(data, uri)
    if value.get("schema") != ARTIFACT_MANIFEST_SCHEMA:
        integrity_error(uri, f"schema is {value.get('schema')!r}, not {ARTIFACT_MANIFEST_SCHEMA}")
    if type(value.get("schema_version")) is not int or value["schema_version"] != 2:
        integrity_error(uri, f"schema_version is {value.get('schema_version')!r}, not 2")
    if value.get("recipe_sha256") != recipe_sha256:
        integrity_error(
            uri, f"recipe_sha256 is {value.get('recipe_sha256')!r}, not the recipe {recipe_sha256}"
        )
    objects = value.get("objects")
    if type(objects) is not list:
        integrity_error(uri, "objects must be a list")
    inventory: dict[str, InventoryObject] = {}
    for number, entry in enumerate(objects):
        item = _inventory_object(uri, number, entry)
        if item.uri in inventory:
            integrity_error(uri, f"objects lists {item.uri} more than once")
        inventory[item.uri] = item
    totals = {"objects": len(inventory), "bytes": sum(item.size for item in inventory.values())}
    declared = value.get("totals")
    if (
        type(declared) is not dict
        or declared != totals
        or any(type(v) is not int for v in declared.values())
    ):
        integrity_error(uri, f"totals are {declared!r}; the objects add up to {totals}")
    if uri in inventory:
        integrity_error(uri, "the artifact manifest lists itself among its objects")
    return inventory
