"""The command line: :func:`build_parser`, the connection options every command takes, and the
commands, each a module that describes itself (``HELP``, ``DESCRIPTION``, ``add_arguments``)
and runs (``run``)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Final, Protocol

from syvain_training_data.cli import adopt, bench, cp, demo, head, index, inspect, verify

if TYPE_CHECKING:
    from syvain_training_data.cli.context import Context


class _Command(Protocol):
    """What a command module holds."""

    @property
    def HELP(self) -> str: ...  # noqa: N802 (a module constant)

    @property
    def DESCRIPTION(self) -> str: ...  # noqa: N802

    def add_arguments(self, parser: argparse.ArgumentParser) -> None: ...

    def run(self, ctx: Context) -> None: ...


# In the order of ``syvain-data --help``.
COMMANDS: Final[dict[str, _Command]] = {
    "inspect": inspect,
    "verify": verify,
    "head": head,
    "cp": cp,
    "index": index,
    "adopt": adopt,
    "bench": bench,
    "demo": demo,
}

PROG: Final = "syvain-data"


def _common_options(suppress: bool) -> argparse.ArgumentParser:
    """The connection options, accepted before or after the subcommand. Subcommand copies
    default to SUPPRESS so that they do not overwrite a value given before the subcommand."""
    default = argparse.SUPPRESS if suppress else None
    parser = argparse.ArgumentParser(add_help=False)
    group = parser.add_argument_group("connection (default: the standard AWS variables)")
    group.add_argument(
        "--endpoint-url",
        default=default,
        metavar="URL",
        help="S3 endpoint, e.g. http://127.0.0.1:8333 (AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL)",
    )
    group.add_argument(
        "--region", default=default, help="S3 region (AWS_REGION, AWS_DEFAULT_REGION)"
    )
    group.add_argument(
        "--access-key-id", default=default, metavar="ID", help="access key (AWS_ACCESS_KEY_ID)"
    )
    group.add_argument(
        "--secret-access-key",
        default=default,
        metavar="SECRET",
        help="secret key, as --secret-access-key=SECRET if it may begin with '-'; prefer "
        "AWS_SECRET_ACCESS_KEY or --secret-access-key-file, as command lines are visible to "
        "others",
    )
    group.add_argument(
        "--secret-access-key-file",
        default=default,
        metavar="PATH",
        help="read the secret key from the first line of this file ('-' for stdin)",
    )
    group.add_argument(
        "--profile",
        default=default,
        metavar="NAME",
        help="AWS profile of ~/.aws/config and credentials (AWS_PROFILE; needs the aws extra)",
    )
    group.add_argument(
        "--no-sign-request",
        action="store_true",
        default=argparse.SUPPRESS if suppress else False,
        help="send unsigned requests, for a public bucket (AWS_SKIP_SIGNATURE)",
    )
    group.add_argument(
        "--allow-http",
        action="store_true",
        default=argparse.SUPPRESS if suppress else False,
        help="read plain http:// URIs (and an http:// HF_ENDPOINT), from a server you trust",
    )
    group.add_argument(
        "--debug",
        action="store_true",
        default=argparse.SUPPRESS if suppress else False,
        help="show tracebacks and debug logs",
    )
    return parser


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Inspect, verify, read and copy syvain-training-data datasets.",
        parents=[_common_options(suppress=False)],
        epilog="Exit status: 0 success, 1 failure or a problem found, 2 usage error.",
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    common = _common_options(suppress=True)
    for name, command in COMMANDS.items():
        subparser = subparsers.add_parser(
            name, parents=[common], help=command.HELP, description=command.DESCRIPTION
        )
        command.add_arguments(subparser)
        subparser.set_defaults(run=command.run)
    return parser
