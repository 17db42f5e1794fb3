"""`python -m syvain_training_data demo`: the README's main job."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m syvain_training_data")
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo", help="write a dataset to a local directory and read it back")
    demo.add_argument("--root", type=Path, default=None, help="directory of the local store")
    demo.add_argument("--records", type=int, default=20_000)
    args = parser.parse_args(argv)
    if args.command == "demo":
        from syvain_training_data.demo import run_demo

        run_demo(args.root, args.records)
    return 0


if __name__ == "__main__":
    sys.exit(main())
