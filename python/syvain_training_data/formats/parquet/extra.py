"""pyarrow, which the ``parquet`` extra installs, imported when a Parquet shard is first
written or read."""

from __future__ import annotations

from typing import Any, Final

INSTALL_HINT: Final = (
    "Parquet shards need pyarrow, which the 'parquet' extra installs: "
    'pip install "syvain-training-data[parquet]"'
)


def pyarrow_modules() -> tuple[Any, Any]:
    """``(pyarrow, pyarrow.parquet)``, or ModuleNotFoundError naming the extra to install."""
    try:
        import pyarrow
        import pyarrow.compute
        import pyarrow.parquet
    except ModuleNotFoundError as error:
        raise ModuleNotFoundError(INSTALL_HINT, name="pyarrow") from error
    return pyarrow, pyarrow.parquet
