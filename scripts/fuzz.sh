#!/usr/bin/env bash
# Runs one cargo-fuzz target of rust/fuzz for a bounded time, then prints the number of
# executions and any findings (crash, leak, timeout or OOM inputs).
#
# Usage: scripts/fuzz.sh TARGET SECONDS     (targets: msgpack_zstf, msgpack_payload, jsonl_gz, record_range, gzip_entry, parquet_read)
# Exits non-zero when the target found something.
set -euo pipefail

target=${1:?usage: scripts/fuzz.sh TARGET SECONDS}
seconds=${2:?usage: scripts/fuzz.sh TARGET SECONDS}
root=$(cd "$(dirname "$0")/.." && pwd)
fuzz_dir="$root/rust/fuzz"

# The targets link the pure-Rust core only; Python just writes the seed corpus.
python=${SYVAIN_PYTHON:-$root/.venv/bin/python}

if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "cargo-fuzz is missing: cargo install cargo-fuzz --locked" >&2
    exit 2
fi
# cargo-fuzz needs nightly flags; stable works with RUSTC_BOOTSTRAP.
toolchain=()
if rustup toolchain list 2>/dev/null | grep -q '^nightly'; then
    toolchain=(+nightly)
else
    export RUSTC_BOOTSTRAP=1
fi

# Small inputs (seeds.py keeps its seeds within it): a run makes millions of executions, not
# thousands of multi-megabyte ones.
max_len=$("$python" -c "import runpy; print(runpy.run_path('$fuzz_dir/seeds.py')['MAX_LEN'])")
corpus="$fuzz_dir/corpus/$target"
artifacts="$fuzz_dir/artifacts/$target"
mkdir -p "$corpus" "$artifacts"
if [ -z "$(ls -A "$corpus")" ]; then
    "$python" "$fuzz_dir/seeds.py" "$target" "$corpus"
fi
before=$(ls "$artifacts" | wc -l)

log=$(mktemp)
status=0
(cd "$root/rust/core" && cargo "${toolchain[@]}" fuzz run --fuzz-dir "$fuzz_dir" "$target" "$corpus" -- \
    -max_total_time="$seconds" -print_final_stats=1 -rss_limit_mb=4096 -timeout=20 \
    -max_len="$max_len" \
    -artifact_prefix="$artifacts/") >"$log" 2>&1 || status=$?

executions=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -1)
findings=$(( $(ls "$artifacts" | wc -l) - before ))
echo "target: $target"
echo "seconds: $seconds"
echo "executions: ${executions:-unknown}"
echo "corpus entries: $(ls "$corpus" | wc -l)"
echo "new findings: $findings"
if [ "$findings" -gt 0 ] || [ "$status" -ne 0 ]; then
    grep -E 'ERROR|panicked|SUMMARY|Test unit written' "$log" | head -20 || true
    ls -1 "$artifacts"
    echo "full log: $log"
    exit 1
fi
rm -f "$log"
