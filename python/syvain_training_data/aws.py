"""AWS profiles (``~/.aws/config`` and ``credentials``: static keys, SSO, ``credential_process``,
assume-role chains) as a ``credential_provider``, through botocore (the ``aws`` extra).

``AwsProfile("name")`` is what ``SyvainTrainingData(profile="name")``, ``AWS_PROFILE`` and the
command line's ``--profile`` use. It pickles as its profile name: each process (a worker, a
Ray task) asks its own botocore, which refreshes temporary credentials itself; the native
client calls it again shortly before the ``expires_at`` it returns.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from typing import Any

from syvain_training_data.extras import missing_extra

__all__ = ["AwsProfile", "require_botocore"]


def require_botocore(what: str) -> None:
    """Raises ModuleNotFoundError naming the ``aws`` extra when botocore is missing."""
    try:
        import botocore.session  # noqa: F401
    except ModuleNotFoundError as error:
        raise missing_extra(f"AWS profiles ({what}) need botocore", "aws", error) from error


class AwsProfile:
    """A credential provider for an AWS profile, asking botocore (one session per process)."""

    def __init__(self, profile: str, *, source: str = "profile") -> None:
        self.profile = profile
        # How the profile was chosen ("profile" or "AWS_PROFILE"), for messages.
        self.source = source
        self._lock = threading.Lock()
        self._session: Any = None
        self._pid = 0

    def __repr__(self) -> str:
        return f"AwsProfile({self.profile!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, AwsProfile) and other.profile == self.profile

    def __hash__(self) -> int:
        return hash((AwsProfile, self.profile))

    def __getstate__(self) -> dict[str, Any]:
        return {"profile": self.profile, "source": self.source}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["profile"], source=state.get("source", "profile"))  # type: ignore[misc]

    def _credentials(self) -> Any:
        require_botocore(
            f"AWS_PROFILE={self.profile}"
            if self.source == "AWS_PROFILE"
            else f"profile {self.profile!r}"
        )
        import botocore.session

        with self._lock:
            if self._session is None or self._pid != os.getpid():
                self._session = botocore.session.Session(profile=self.profile)
                self._pid = os.getpid()
            session = self._session
        return session.get_credentials()

    def __call__(self) -> Mapping[str, Any]:
        credentials = self._credentials()
        if credentials is None:
            raise ValueError(f"botocore found no credentials for AWS profile {self.profile!r}")
        # Refreshes temporary credentials (SSO, assume-role, credential_process) when due.
        frozen = credentials.get_frozen_credentials()
        result: dict[str, Any] = {
            "access_key_id": frozen.access_key,
            "secret_access_key": frozen.secret_key,
            "session_token": frozen.token or None,
        }
        expiry = getattr(credentials, "_expiry_time", None)
        if expiry is not None and expiry.utcoffset() is not None:
            result["expires_at"] = expiry
        return result
