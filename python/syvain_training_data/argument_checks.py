"""Checks of the arguments the public API takes, made where they are passed: a TypeError or
ValueError that names the argument and what it accepts, instead of an accepted wrong value or a
late error that names nothing the caller wrote. No optional dependency here."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from syvain_training_data.manifest import ManifestShard
from syvain_training_data.storage import StorageConfig

__all__ = [
    "boolean",
    "callable_or_none",
    "manifest_shard",
    "mapping_or_none",
    "number",
    "records_iterable",
    "storage_config_or_none",
]


def _kind(value: object) -> str:
    return type(value).__name__


def boolean(value: object, name: str) -> bool:
    """``value`` when it is a bool (True or False, not 1, "y" or None)."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, not {_kind(value)} {value!r:.40}")
    return value


def number(value: object, name: str) -> int | float:
    """``value`` when it is an int or a float (not a bool)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name} must be an int or a float, not {_kind(value)}")
    return value


def callable_or_none(value: object, name: str) -> Any:
    if value is not None and not callable(value):
        raise TypeError(f"{name} must be a callable or None, not {_kind(value)}")
    return value


def mapping_or_none(value: object, name: str) -> Mapping[str, Any] | None:
    if value is not None and not isinstance(value, Mapping):
        raise TypeError(
            f"{name} must be a mapping (a dict of keyword arguments) or None, not {_kind(value)}"
        )
    return value


def manifest_shard(value: object, name: str = "shard") -> ManifestShard:
    """``value`` when it is a :class:`ManifestShard` (a URI alone says nothing of the records
    and size a reader checks)."""
    if not isinstance(value, ManifestShard):
        hint = (
            " (a URI alone is not a shard: take it from the manifest)"
            if isinstance(value, str)
            else ""
        )
        raise TypeError(f"{name} must be a ManifestShard, not {_kind(value)}{hint}")
    return value


def storage_config_or_none(value: object) -> StorageConfig | None:
    if value is not None and not isinstance(value, StorageConfig):
        raise TypeError(
            "storage_config must be a StorageConfig (StorageConfig.create(...)) or None, not "
            f"{_kind(value)}"
        )
    return value


def records_iterable(value: object) -> Iterable[Any]:
    """``value`` when it can be records: an iterable that is not itself one record (a
    mapping) nor a str or bytes."""
    if isinstance(value, Mapping):
        raise TypeError(
            "records must be an iterable of records (mappings), not one mapping (its keys would "
            "be taken as records): wrap it in a list"
        )
    if isinstance(value, str | bytes | bytearray) or not isinstance(value, Iterable):
        raise TypeError(f"records must be an iterable of mappings, not {_kind(value)}")
    return value
