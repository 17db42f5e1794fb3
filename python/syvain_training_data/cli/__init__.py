"""The ``syvain-data`` command (also ``python -m syvain_training_data``).

Subcommands: ``inspect``, ``verify``, ``head``, ``cp``, ``bench`` and ``demo``;
``syvain-data --help`` and ``syvain-data COMMAND --help`` describe them. :func:`main` runs one
command line and returns its exit status, so tests (and other programs) call it in-process.

Decisions:

- **Exit status.** 0 on success; 1 when a command fails, ``verify`` included when it finds a
  problem; 2 for a usage error (bad arguments, a URI that is neither ``s3://bucket/key`` nor
  ``file:///absolute/path`` nor a local path, s3:// without credentials, an invalid endpoint).
  A failure prints one line, ``syvain-data: error: {ExceptionType}: {first line}``, and no
  traceback unless ``--debug`` is given; Ctrl-C exits with 130.
- **Credentials** come from the flags or the standard AWS variables, exactly as
  :meth:`SyvainTrainingData.from_env` reads them: a flag overrides its variable. The secret is
  best left in ``AWS_SECRET_ACCESS_KEY`` or read with ``--secret-access-key-file PATH`` (``-``
  for stdin): a command line is visible to other users of the machine. A secret given on the
  command line that begins with ``-`` must be written ``--secret-access-key=SECRET`` (argparse
  would take it for an option). It is never printed, not even with ``--debug``.
- **Local paths** are accepted wherever a URI is: an argument without ``://`` is a path,
  turned into a ``file:///absolute/path`` URI.
- **Escaped output.** Every value printed that came from a manifest, a store or an error
  quoting them (names, URIs, etags, messages, log lines, tracebacks) has its terminal control
  characters escaped (:func:`syvain_training_data.cli.output.printable`): a manifest cannot
  inject terminal escape sequences, carriage returns, fake lines or bidi reordering.
- **Progress** (``verify --deep``, ``cp --with-shards``) is one line on stderr, redrawn in place
  on a terminal and printed every few seconds otherwise; a small hand-written line rather than
  tqdm keeps the base install at pydantic only. Bytes are the shards' manifest sizes, credited
  as records are read (proportionally within a shard, exactly when it ends). ``bench`` and
  ``demo`` draw a bar of batches or tasks the same way, printed only when done off a terminal.
- **head** prints records as JSON lines (ASCII, keys in record order); ``bytes`` values become
  ``{"$base64": "..."}``.
- **cp** copies the manifest's exact bytes; with ``--with-shards`` see
  :func:`syvain_training_data.cli.cp.copy_layout`. Destination objects are written
  create-only: an existing identical object is reused (a re-run finishes an interrupted copy),
  different bytes are an error, nothing is overwritten.

The package has one module per command (``inspect``, ``verify``, ``head``, ``cp``, ``bench``,
``demo``: its help, its arguments and ``run``); ``parser`` builds the command line from them,
``arguments`` holds the arguments several commands share, ``context`` turns the command line
into a client and URIs,
``output`` writes tables and the progress lines, ``shards`` selects a manifest's shards (a
split's and a stage's with the loader's ``select_shards``) and ``errors`` holds the
exceptions that set the exit status. :func:`main` is here.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import traceback
from collections.abc import Callable, Mapping, Sequence
from typing import Final, TextIO

from syvain_training_data.cli.context import Context, make_client
from syvain_training_data.cli.errors import CommandFailed, UsageError, describe
from syvain_training_data.cli.output import EscapingFormatter, printable, printable_lines
from syvain_training_data.cli.parser import PROG, build_parser

__all__ = ["main"]

EXIT_OK: Final = 0
EXIT_FAILED: Final = 1
EXIT_USAGE: Final = 2
EXIT_INTERRUPTED: Final = 130


def main(
    argv: Sequence[str] | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    stdout: TextIO | None = None,
    stderr: TextIO | None = None,
) -> int:
    """Runs one command line (``sys.argv[1:]`` by default) and returns its exit status.

    ``environ`` (default ``os.environ``) supplies the AWS variables; output goes to
    ``stdout`` and ``stderr`` (default the process's).
    """
    out = stdout or sys.stdout
    err = stderr or sys.stderr
    parser = build_parser()
    try:
        # argparse prints help and usage errors to sys.stdout / sys.stderr itself.
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            args = parser.parse_args(argv)
    except SystemExit as exit_:  # --help (0) or a usage error argparse printed (2)
        return exit_.code if isinstance(exit_.code, int) else EXIT_USAGE
    debug = bool(getattr(args, "debug", False))
    handler = logging.StreamHandler(err)
    handler.setFormatter(EscapingFormatter("%(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=logging.DEBUG if debug else logging.WARNING, handlers=[handler])
    try:
        client = make_client(args, os.environ if environ is None else environ)
        run: Callable[[Context], None] = args.run
        run(Context(args, client, out, err))
        return EXIT_OK
    except CommandFailed:
        return EXIT_FAILED
    except UsageError as error:
        _report(err, debug, f"{PROG} {args.command}: error: {error}")
        return EXIT_USAGE
    except KeyboardInterrupt:
        _report(err, debug, f"{PROG}: interrupted")
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # The reader went away (``syvain-data head ... | head -1``): nothing left to do.
        _silence_stdout(out)
        return EXIT_OK
    except Exception as error:
        if isinstance(error, ValueError) and "no credentials found" in str(error):
            # Nothing to sign s3:// requests with: a usage error, as a missing flag would be.
            _report(err, debug, f"{PROG} {args.command}: error: {str(error).splitlines()[0]}")
            return EXIT_USAGE
        if isinstance(error, ValueError) and "pass allow_http=True" in str(error):
            # A plain http:// URI without --allow-http: a usage error naming the flag.
            message = (
                str(error).splitlines()[0].replace("pass allow_http=True", "pass --allow-http")
            )
            _report(err, debug, f"{PROG} {args.command}: error: {message}")
            return EXIT_USAGE
        _report(err, debug, f"{PROG}: error: {describe(error)}")
        return EXIT_FAILED


def _report(err: TextIO, debug: bool, line: str) -> None:
    """Prints the failure line (and with ``--debug`` the traceback), control characters
    escaped: messages quote manifest names and URIs."""
    if debug:
        err.write(printable_lines(traceback.format_exc()))
    print(printable(line), file=err)


def _silence_stdout(out: TextIO) -> None:
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, out.fileno())
    except (OSError, ValueError, AttributeError):
        pass  # not a real file: nothing will be flushed into a closed pipe at exit
