"""The one message for an optional extra that is not installed.

The base install stays light (SPEC section 1); each feature that needs more names its extra
and the command that installs it, in the same words everywhere.
"""

from __future__ import annotations

__all__ = ["install_command", "missing_extra"]


def install_command(extra: str) -> str:
    """The pip command that installs ``extra``."""
    return f"pip install 'syvain-training-data[{extra}]'"


def missing_extra(requirement: str, extra: str, error: ModuleNotFoundError) -> ModuleNotFoundError:
    """The error to raise (``from error``) when an import of ``extra`` failed: ``requirement``
    says who needs what, e.g. ``"Parquet shards need pyarrow"``."""
    return ModuleNotFoundError(
        f"{requirement}, the {extra!r} extra: {install_command(extra)}", name=error.name
    )
