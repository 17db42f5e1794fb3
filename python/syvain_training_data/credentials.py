"""Credentials the native client asks Python for: which callable a storage configuration
provides (its ``credential_provider``, an AWS profile through botocore, or none), and the
checks of what that callable returns. Errors name the provider and the field, never a value."""

from __future__ import annotations

import datetime
import functools
import os
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from syvain_training_data.storage import StorageConfig


def provider_for(config: StorageConfig) -> ProviderCall | None:
    """The callable the native client asks for credentials, or None (static keys, unsigned,
    or the native default chain)."""
    if config.credential_provider is not None:
        return ProviderCall(config.credential_provider)
    if config.profile is not None:
        from syvain_training_data.aws import AwsProfile

        # Without botocore, the first s3:// request names the extra (file:// ones still work).
        return ProviderCall(AwsProfile(config.profile))
    if config.credential_source != "chain":
        return None
    # The chain: AWS_PROFILE comes after the environment's keys and before the rest (which the
    # native chain tries); without botocore it fails the first s3:// request, not file:// ones.
    profile = os.environ.get("AWS_PROFILE") or None
    has_keys = os.environ.get("AWS_ACCESS_KEY_ID") and os.environ.get("AWS_SECRET_ACCESS_KEY")
    if profile is None or has_keys:
        return None
    from syvain_training_data.aws import AwsProfile

    return ProviderCall(AwsProfile(profile, source="AWS_PROFILE"))


_PROVIDER_KEYS: Final = frozenset(
    {"access_key_id", "secret_access_key", "session_token", "expires_at"}
)


def provider_name(provider: object) -> str:
    """A provider's name for messages: its qualified name, never its ``repr`` (which could
    show arguments such as a token)."""
    if isinstance(provider, functools.partial):
        provider = provider.func
    name = getattr(provider, "__qualname__", None)
    if not isinstance(name, str):
        name = type(provider).__qualname__
    module = getattr(provider, "__module__", None) or type(provider).__module__
    return f"{module}.{name}" if module and module != "builtins" else name


class ProviderCall:
    """Calls a ``credential_provider`` and checks what it returns: ``(access_key_id,
    secret_access_key, session_token, seconds until expires_at)`` for the native client.
    Errors name the provider and the field, never a value."""

    def __init__(self, provider: Callable[[], Mapping[str, Any]]) -> None:
        self.provider = provider
        self.name = provider_name(provider)

    def __repr__(self) -> str:
        return f"credential_provider {self.name}"

    def __call__(self) -> tuple[str, str, str | None, float | None]:
        try:
            returned = self.provider()
        except Exception as error:
            first = str(error).splitlines()[0] if str(error) else ""
            raise ValueError(
                f"{self!r} raised {type(error).__name__}: {first}".rstrip(": ")
            ) from error
        if not isinstance(returned, Mapping):
            raise TypeError(
                f"{self!r} returned {type(returned).__name__}; expected a mapping with "
                "access_key_id, secret_access_key, optional session_token and expires_at"
            )
        unknown = sorted(str(key) for key in returned if key not in _PROVIDER_KEYS)
        if unknown:
            raise ValueError(f"{self!r} returned unknown keys {unknown}")
        values: list[str | None] = []
        for field in ("access_key_id", "secret_access_key", "session_token"):
            value = returned.get(field)
            if value is None and field == "session_token":
                values.append(None)
                continue
            if value is None:
                raise ValueError(f"{self!r} returned no {field}")
            if not isinstance(value, str):
                raise TypeError(
                    f"{self!r} returned {field} of type {type(value).__name__}; expected str"
                )
            if not value:
                raise ValueError(f"{self!r} returned an empty {field}")
            values.append(value)
        expires_at = returned.get("expires_at")
        seconds: float | None = None
        if expires_at is not None:
            if not isinstance(expires_at, datetime.datetime):
                raise TypeError(
                    f"{self!r} returned expires_at of type {type(expires_at).__name__}; "
                    "expected an aware datetime"
                )
            if expires_at.utcoffset() is None:
                raise ValueError(
                    f"{self!r} returned a naive expires_at; expected an aware datetime "
                    "(e.g. datetime.now(timezone.utc) + timedelta(hours=1))"
                )
            seconds = (expires_at - datetime.datetime.now(datetime.UTC)).total_seconds()
        key_id, secret, token = values
        assert key_id is not None and secret is not None
        return key_id, secret, token, seconds
