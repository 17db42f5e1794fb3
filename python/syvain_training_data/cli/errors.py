"""The exceptions that set a command's exit status, and the one line that describes an error."""

from __future__ import annotations


class UsageError(Exception):
    """A command line that cannot run as given: exit status 2."""


class CommandFailed(Exception):
    """A command finished but found problems it already reported: exit status 1."""


def describe(error: BaseException) -> str:
    r"""``"{ExceptionType}: {first line}"``. Lines end at ``"\n"`` only: a carriage return or
    another control character inside a quoted name or URI is kept (and escaped on output)."""
    lines = str(error).strip().split("\n")
    return f"{type(error).__name__}: {lines[0] if lines else '(no message)'}"
