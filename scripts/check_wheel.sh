#!/usr/bin/env bash
# The release wheel, proven on this machine (`./dev wheel-check`, run by .ci/run):
#   1. the wheel matrix of .github/workflows/wheels.yml, as cibuildwheel lists it from
#      [tool.cibuildwheel] in pyproject.toml (offline: it only reads its own tables);
#   2. an abi3 manylinux2014 wheel built with `maturin build --release --zig` (zig links against
#      glibc 2.17 symbols, as the manylinux2014 image would);
#   3. `auditwheel show` must call it manylinux_2_17 compatible, every DT_NEEDED library of its
#      extension must be in auditwheel's manylinux_2_17 whitelist, and it must be under 15 MB;
#   4. it installs (binary packages only, pydantic from PyPI) into fresh Python 3.12 and 3.13
#      environments with no cargo or rustc on PATH, where scripts/wheel_smoke.py writes and
#      reads a dataset and runs the installed command.
# Tools live in target/wheel-check/tools and the release build in target/wheel-check/cargo, so the
# develop build in target/ is left alone. Costs one release build (a few minutes on 2 cores).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
WORK=$ROOT/target/wheel-check
TOOLS=$WORK/tools
DIST=$WORK/dist
MAX_BYTES=15000000
ARCH=$(uname -m)

# A CPython of exactly this minor version, found the way ./dev finds one.
find_python() {
  local version=$1 candidate
  for candidate in "python$version" "$HOME"/.pyenv/versions/"$version".*/bin/python3 \
    "/usr/local/bin/python$version" "/usr/bin/python$version"; do
    command -v "$candidate" >/dev/null 2>&1 || [ -x "$candidate" ] || continue
    if "$candidate" -c "import sys; sys.exit(sys.version_info[:2] != tuple(map(int, '$version'.split('.'))))" 2>/dev/null; then
      command -v "$candidate" 2>/dev/null || echo "$candidate"
      return 0
    fi
  done
  echo "error: no Python $version found (pyenv, /usr/local/bin or /usr/bin)" >&2
  return 1
}

echo "== tools (maturin, ziglang, auditwheel, cibuildwheel) in $TOOLS"
if [ ! -x "$TOOLS/bin/python" ]; then
  "$(find_python 3.12)" -m venv "$TOOLS"
fi
"$TOOLS/bin/python" -m pip install --quiet "maturin>=1.7,<2" "ziglang>=0.13" "auditwheel>=6" "cibuildwheel>=3"

echo "== build identifiers of the wheel matrix (cibuildwheel --print-build-identifiers)"
identifiers=""
for platform in linux macos windows; do
  listed=$("$TOOLS/bin/cibuildwheel" --print-build-identifiers --platform "$platform" | tr '\n' ' ')
  echo "$platform: $listed"
  identifiers="$identifiers $listed"
done
for wanted in cp312-manylinux_x86_64 cp312-manylinux_aarch64 cp312-musllinux_x86_64 \
  cp312-musllinux_aarch64 cp312-macosx_x86_64 cp312-macosx_arm64 cp312-win_amd64 \
  cp313-manylinux_x86_64 cp314-win_amd64; do
  case " $identifiers " in
    *" $wanted "*) ;;
    *) echo "error: the matrix lacks $wanted" >&2; exit 1 ;;
  esac
done

echo "== maturin build --release --zig --compatibility manylinux2014"
rm -rf "$DIST"
if ! PATH="$TOOLS/bin:$PATH" CARGO_TARGET_DIR="$WORK/cargo" \
  "$TOOLS/bin/maturin" build --release --zig --compatibility manylinux2014 --out "$DIST" \
  >"$WORK/build.log" 2>&1; then
  cat "$WORK/build.log" >&2
  echo "error: the wheel build failed" >&2
  exit 1
fi
grep -v "^ *Compiling " "$WORK/build.log" || true
shopt -s nullglob
wheels=("$DIST"/*.whl)
if [ "${#wheels[@]}" -ne 1 ]; then
  echo "error: expected one wheel in $DIST, found ${#wheels[@]}" >&2
  exit 1
fi
wheel=${wheels[0]}
echo "wheel: $(basename "$wheel")"

echo "== auditwheel show"
"$TOOLS/bin/auditwheel" show "$wheel" | tee "$WORK/auditwheel.txt"
if ! tr -s ' \n' ' ' <"$WORK/auditwheel.txt" | grep -q "consistent with the following platform tag: \"manylinux_2_17_$ARCH\""; then
  echo "error: auditwheel does not find the wheel manylinux_2_17 (manylinux2014) compatible" >&2
  exit 1
fi
"$TOOLS/bin/python" - "$wheel" <<'PY'
"""Every library the extension needs is the loader or in auditwheel's manylinux_2_17 list."""
import io
import json
import sys
import zipfile
from importlib.resources import files

from elftools.elf.dynamic import DynamicSection
from elftools.elf.elffile import ELFFile

policies = json.loads((files("auditwheel.policy") / "manylinux-policy.json").read_text())
allowed = next(set(p["lib_whitelist"]) for p in policies if p["name"] == "manylinux_2_17")
with zipfile.ZipFile(sys.argv[1]) as wheel:
    for name in wheel.namelist():
        if name.endswith(".so"):
            elf = ELFFile(io.BytesIO(wheel.read(name)))
            needed = sorted(
                tag.needed
                for section in elf.iter_sections()
                if isinstance(section, DynamicSection)
                for tag in section.iter_tags()
                if tag.entry.d_tag == "DT_NEEDED"
            )
            # The ELF loader itself is always there (auditwheel skips it the same way).
            outside = [
                library
                for library in needed
                if library not in allowed
                and not library.startswith("ld-linux")
                and library not in ("ld64.so.1", "ld64.so.2")
            ]
            print(f"{name} links: {', '.join(needed)}")
            if outside:
                sys.exit(f"error: {name} links outside the manylinux2014 set: {outside}")
PY
size=$(stat -c %s "$wheel")
echo "wheel size: $size bytes (limit $MAX_BYTES)"
if [ "$size" -ge "$MAX_BYTES" ]; then
  echo "error: the wheel is $size bytes, over $MAX_BYTES" >&2
  exit 1
fi

# PATH without any Rust toolchain: the wheel must install and run without a compiler.
CLEAN_PATH=/usr/bin:/bin
for version in 3.12 3.13; do
  python=$(find_python "$version")
  venv=$WORK/venv-$version
  echo "== fresh Python $version environment ($python), no Rust toolchain on PATH"
  rm -rf "$venv"
  "$python" -m venv "$venv"
  if env PATH="$venv/bin:$CLEAN_PATH" bash -c 'command -v cargo || command -v rustc' >/dev/null; then
    echo "error: cargo or rustc is still on the stripped PATH" >&2
    exit 1
  fi
  smoke_dir=$(mktemp -d)
  (
    cd "$smoke_dir"
    export PATH="$venv/bin:$CLEAN_PATH"
    unset CARGO_HOME RUSTUP_HOME RUSTUP_TOOLCHAIN VIRTUAL_ENV PYTHONPATH
    python -m pip install --quiet --only-binary :all: "$wheel"
    python -m pip list --format=freeze | tr '\n' ' '
    echo
    python "$ROOT/scripts/wheel_smoke.py"
  )
  rm -rf "$smoke_dir" "$venv"
done
echo "wheel-check: $(basename "$wheel") ($size bytes): manylinux2014, installs and runs on 3.12 and 3.13"
