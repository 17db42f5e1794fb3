"""`python -m syvain_training_data`: the `syvain-data` command (see `cli/`)."""

from __future__ import annotations

import sys

from syvain_training_data.cli import main

if __name__ == "__main__":
    sys.exit(main())
