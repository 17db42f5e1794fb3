"""What a command runs with: :class:`Context`, the client built from the credential flags and
variables, and the URI arguments (local paths, credentials, shard schemes)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final, TextIO

from syvain_training_data.cli.errors import UsageError
from syvain_training_data.client import SyvainTrainingData
from syvain_training_data.manifest import ManifestShard
from syvain_training_data.uris import FILE_PREFIX, check_shard_scheme, check_uri

# Flag -> the AWS variable it overrides (SyvainTrainingData.from_env reads these).
_CREDENTIAL_FLAGS: Final = (
    ("endpoint_url", "AWS_ENDPOINT_URL_S3"),
    ("region", "AWS_REGION"),
    ("access_key_id", "AWS_ACCESS_KEY_ID"),
    ("secret_access_key", "AWS_SECRET_ACCESS_KEY"),
)


@dataclass
class Context:
    """What a subcommand gets: its arguments, the client, and where to write."""

    args: argparse.Namespace
    client: SyvainTrainingData
    stdout: TextIO
    stderr: TextIO


def _read_secret(path: str) -> str:
    """The first line of ``path`` (``-``: stdin) without its line ending; UsageError if it
    cannot be read or is empty. The message names the path, never the content."""
    try:
        if path == "-":
            line = sys.stdin.readline()
        else:
            with open(path, encoding="utf-8") as file:
                line = file.readline()
    except OSError as error:
        raise UsageError(f"cannot read the secret key from {path}: {error.strerror}") from None
    except UnicodeDecodeError:
        raise UsageError(f"cannot read the secret key from {path}: not UTF-8 text") from None
    secret = line.rstrip("\r\n")
    if not secret:
        raise UsageError(f"{path} holds no secret key on its first line")
    return secret


def make_client(args: argparse.Namespace, environ: Mapping[str, str]) -> SyvainTrainingData:
    env = dict(environ)
    secret_file = getattr(args, "secret_access_key_file", None)
    if secret_file and getattr(args, "secret_access_key", None):
        raise UsageError("give --secret-access-key or --secret-access-key-file, not both")
    if secret_file:
        env["AWS_SECRET_ACCESS_KEY"] = _read_secret(secret_file)
    profile = getattr(args, "profile", None)
    unsigned = bool(getattr(args, "no_sign_request", False))
    keys_given = bool(
        getattr(args, "access_key_id", None)
        or getattr(args, "secret_access_key", None)
        or secret_file
    )
    if sum((bool(profile), unsigned, keys_given)) > 1:
        raise UsageError(
            "give one of --profile, --no-sign-request and --access-key-id/--secret-access-key"
        )
    if profile or unsigned:
        # An explicit choice wins over keys in the environment, as with the AWS CLI.
        for variable in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
            env.pop(variable, None)
    if profile:
        env["AWS_PROFILE"] = profile
    if unsigned:
        env["AWS_SKIP_SIGNATURE"] = "true"
    for flag, variable in _CREDENTIAL_FLAGS:
        value = getattr(args, flag, None)
        if value:
            env[variable] = value
    try:
        return SyvainTrainingData.from_env(env, allow_http=bool(getattr(args, "allow_http", False)))
    except (ValueError, ModuleNotFoundError) as error:
        raise UsageError(str(error).splitlines()[0]) from error


def is_local_path(argument: str) -> bool:
    """A URI argument without ``://`` is a local path."""
    return "://" not in argument


def to_uri(argument: str) -> str:
    """A URI argument as given, or a local path as a ``file:///absolute/path`` URI.

    A URI is checked by :func:`~syvain_training_data.uris.check_uri`: UsageError for another
    scheme or a malformed s3:// or file:// URI. Credentials for s3:// are found when the first
    request is signed: a client without keys resolves the AWS default chain then, and "no
    credentials found" exits 2 (see :func:`syvain_training_data.cli.main`).
    """
    if is_local_path(argument):
        path = Path(argument).expanduser().resolve().as_posix()
        # Kept literally (file:// URIs are not percent-decoded); a Windows path gets a root slash.
        return FILE_PREFIX + (path if path.startswith("/") else "/" + path)
    try:
        return check_uri(argument)
    except ValueError as error:
        raise UsageError(
            f"{error}: use s3://bucket/key, file:///absolute/path or a local path"
        ) from None


def check_schemes(ctx: Context, manifest_uri: str, shards: Sequence[ManifestShard]) -> None:
    """Every shard's scheme is its manifest's (SPEC 4), before any shard is read."""
    for shard in shards:
        check_shard_scheme(
            manifest_uri, shard.uri, allow_mixed_schemes=ctx.args.allow_mixed_schemes
        )
