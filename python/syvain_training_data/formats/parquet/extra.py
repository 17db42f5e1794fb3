"""pyarrow, which the ``parquet`` extra installs, imported when a Parquet shard is first
written or read."""

from __future__ import annotations

from typing import Any

from syvain_training_data.extras import missing_extra


def pyarrow_modules() -> tuple[Any, Any]:
    """``(pyarrow, pyarrow.parquet)``, or ModuleNotFoundError naming the extra to install."""
    try:
        import pyarrow
        import pyarrow.compute
        import pyarrow.parquet
    except ModuleNotFoundError as error:
        raise missing_extra("Parquet shards need pyarrow", "parquet", error) from error
    return pyarrow, pyarrow.parquet
