"""Peak resident memory of a child interpreter, for the bounded-memory tests.

A test that measures memory runs its reader in a new interpreter: the test process's own heap
(pytest, fixtures, generated shards) would hide what the reader holds. The child reads its peak
from VmHWM, not ``ru_maxrss``: Linux keeps ``ru_maxrss`` across exec, so it would show the
parent's peak.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from typing import Any

# Defines peak_rss_kib() and s3_config() in the child. s3_config builds a StorageConfig from the
# endpoint and region it is given and the credentials in the child's environment, so no secret
# is written into the script.
CHILD_PRELUDE = textwrap.dedent(
    """
    import json, os

    def peak_rss_kib():
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])

    def s3_config(endpoint, region):
        from syvain_training_data.storage import StorageConfig
        return StorageConfig.create(
            s3_base_url=endpoint,
            region=region,
            access_key_id=os.environ["AWS_ACCESS_KEY_ID"],
            secret_access_key=os.environ["AWS_SECRET_ACCESS_KEY"],
        )
    """
)


def run_child(body: str, *, env: dict[str, str] | None = None, timeout: float = 600) -> Any:
    """Runs ``body`` (dedented) after ``CHILD_PRELUDE`` in a new interpreter and returns the JSON
    value it prints last. The body measures with ``before = peak_rss_kib()`` ...
    ``peak_rss_kib() - before`` and prints ``json.dumps(...)``."""
    script = CHILD_PRELUDE + textwrap.dedent(body)
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=timeout, env=env
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])
