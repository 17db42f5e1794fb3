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
from syvain_training_data.uris import check_shard_scheme, check_uri

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
    for flag, variable in _CREDENTIAL_FLAGS:
        value = getattr(args, flag, None)
        if value:
            env[variable] = value
    try:
        return SyvainTrainingData.from_env(env)
    except ValueError as error:
        raise UsageError(str(error).splitlines()[0]) from error


def to_uri(argument: str) -> str:
    """A URI argument as given, or a local path as a ``file:///absolute/path`` URI.

    Raises UsageError for another scheme or a malformed s3:// or file:// URI.
    """
    if "://" not in argument:
        path = Path(argument).expanduser().resolve().as_posix()
        return "file://" + (path if path.startswith("/") else "/" + path)
    try:
        return check_uri(argument)
    except ValueError as error:
        raise UsageError(
            f"{error}: use s3://bucket/key, file:///absolute/path or a local path"
        ) from None


def require_credentials(ctx: Context, *uris: str) -> None:
    config = ctx.client.storage_config
    if any(uri.startswith("s3://") for uri in uris) and not (
        config.access_key_id and config.secret_access_key
    ):
        raise UsageError(
            "s3:// URIs need credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY "
            "(and AWS_ENDPOINT_URL for a server other than AWS), or pass --access-key-id"
        )


def manifest_uri(ctx: Context, argument: str) -> str:
    uri = to_uri(argument)
    require_credentials(ctx, uri)
    return uri


def check_schemes(ctx: Context, manifest_uri: str, shards: Sequence[ManifestShard]) -> None:
    """Every shard's scheme is its manifest's (SPEC 4), before any shard is read."""
    for shard in shards:
        check_shard_scheme(
            manifest_uri, shard.uri, allow_mixed_schemes=ctx.args.allow_mixed_schemes
        )
