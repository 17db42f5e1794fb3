#!/usr/bin/env bash
# Makes a Python environment with the loader benchmark's peers (mosaicml-streaming, litdata):
#   scripts/peer_env.sh DIR && .venv/bin/python benchmarks/loader.py --peer-python DIR/bin/python
# litdata at its newest release, with zstandard so it reads its own zstd chunks.
set -euo pipefail
dir=${1:?usage: scripts/peer_env.sh DIR}
python=${SYVAIN_PYTHON:-python3}
"$python" -m venv "$dir"
"$dir/bin/python" -m pip install --quiet --upgrade pip
"$dir/bin/python" -m pip install --quiet mosaicml-streaming litdata zstandard
"$dir/bin/python" -c "import streaming, litdata; print('peers:', streaming.__version__, litdata.__version__)"
