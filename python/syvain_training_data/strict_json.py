"""Strict JSON: the values a manifest's metadata may hold, and strict parsing of JSON text.

Rules, and why:

- **Values are finite, encodable JSON.** :data:`JsonValue` is ``None``, ``bool``, ``int``, a
  finite ``float``, ``str``, ``list`` or ``dict`` with ``str`` keys, by exact type (subclasses
  such as enums, and tuples or other mappings, are rejected).  NaN and infinities are rejected:
  strict JSON has no token for them and pydantic would dump them as ``null``, so a manifest
  holding one could not round-trip through its canonical bytes.  For the same reason every
  string (:data:`Utf8Str`: names, URIs, etags, metadata keys and values) must be encodable as
  UTF-8: a lone surrogate, which a ``"\\ud800"`` JSON escape can produce, is rejected.
- **Integers have at most 4300 digits**, Python's default limit for converting between int and
  str (``sys.int_info.default_max_str_digits``): ``json.loads`` could not read a longer one
  back from the canonical bytes.
- **JSON text is parsed strictly** (:func:`loads_strict_json`): the ``NaN`` / ``Infinity`` /
  ``-Infinity`` tokens, numbers that overflow a float (``1e400``), duplicate keys in one object
  (ambiguous; canonical bytes never contain them) and nesting too deep for the parser are
  errors.
"""

from __future__ import annotations

import json
import math
from typing import Annotated, Any

from pydantic import AfterValidator, Discriminator, Field, Tag

__all__ = [
    "JsonObject",
    "JsonValue",
    "Utf8Str",
    "json_depth",
    "loads_strict_json",
]


def _require_utf8(value: str) -> str:
    """Reject strings that cannot be encoded as UTF-8 (lone surrogates)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("string is not encodable as UTF-8 (it holds a lone surrogate)") from None
    return value


_MAX_INT_DIGITS = 4300
_INT_BOUND = 10**_MAX_INT_DIGITS


def _require_int_digits(value: int) -> int:
    """Reject integers too long for Python's default int/str conversion limit."""
    if not -_INT_BOUND < value < _INT_BOUND:
        raise ValueError(f"integer has more than {_MAX_INT_DIGITS} digits")
    return value


Utf8Str = Annotated[str, AfterValidator(_require_utf8)]
"""A ``str`` that can be encoded as UTF-8 (no lone surrogate)."""

_Int = Annotated[int, Field(strict=True), AfterValidator(_require_int_digits)]
_FiniteFloat = Annotated[float, Field(strict=True, allow_inf_nan=False)]

_JSON_TAGS: dict[type, str] = {
    type(None): "null",
    bool: "bool",
    int: "int",
    float: "float",
    str: "str",
    list: "array",
    dict: "object",
}


def _json_tag(value: Any) -> str | None:
    """Discriminate JSON values by exact type, so that bool never passes as int."""
    return _JSON_TAGS.get(type(value))


type JsonValue = Annotated[
    Annotated[None, Tag("null")]
    | Annotated[bool, Tag("bool")]
    | Annotated[_Int, Tag("int")]
    | Annotated[_FiniteFloat, Tag("float")]
    | Annotated[Utf8Str, Tag("str")]
    | Annotated[list[JsonValue], Tag("array")]
    | Annotated[dict[Utf8Str, JsonValue], Tag("object")],
    Discriminator(
        _json_tag,
        custom_error_type="invalid_json_value",
        custom_error_message=(
            "Input should be a JSON value: None, bool, int, finite float, str, "
            "list or dict with str keys"
        ),
    ),
]
"""A JSON value, validated by exact type in strict mode (see the module docstring)."""

type JsonObject = dict[Utf8Str, JsonValue]
"""A JSON object: a ``dict`` with ``str`` keys and :data:`JsonValue` values."""


def json_depth(value: object) -> int:
    """Return how many arrays and objects deep ``value`` nests (0 for a scalar), iteratively."""
    deepest = 0
    stack: list[tuple[object, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: list[object] = list(item.values())
        elif isinstance(item, list):
            children = item
        else:
            continue
        depth += 1
        deepest = max(deepest, depth)
        stack.extend((child, depth) for child in children)
    return deepest


class _StrictJsonError(ValueError):
    """JSON text that is well formed for Python's json module but not strict JSON."""


def _reject_constant(token: str) -> object:
    raise _StrictJsonError(f"{token} is not a JSON number")


def _parse_finite_float(token: str) -> float:
    value = float(token)
    if not math.isfinite(value):
        raise _StrictJsonError(f"number {token} is out of range")
    return value


def _object_without_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise _StrictJsonError(f"duplicate object key {key!r}")
        result[key] = value
    return result


def loads_strict_json(text: str) -> object:
    """Parse strict JSON text: no repeated object keys, no NaN or Infinity, no number out of
    float range. Raises ValueError (with the reason) otherwise, also for nesting too deep."""
    try:
        return json.loads(
            text,
            object_pairs_hook=_object_without_duplicates,
            parse_constant=_reject_constant,
            parse_float=_parse_finite_float,
        )
    except RecursionError:
        raise _StrictJsonError("JSON nesting is too deep") from None
