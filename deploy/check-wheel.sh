#!/usr/bin/env bash
# Installs a `sonde` wheel into a fresh venv, as a user would, and runs the
# Python test suite and the digits example against the installed package
# (not the Bazel tree):
#
#   bash deploy/check-wheel.sh                    Debian's /usr/bin/python3, its
#                                                 torch 1.13 (--system-site-packages)
#   bash deploy/check-wheel.sh --python ~/.pyenv/versions/3.12.1/bin/python3 --pypi-torch
#                                                 a fresh venv with the newest
#                                                 torch, numpy, scikit-learn and
#                                                 pytest from PyPI (the CUDA build
#                                                 of torch: about 5 GB)
#
# The wheel is dist/wheels/sonde-<version>-<cpXY>-*.whl, built by
# deploy/build-wheels.sh for that Python when missing; with --fresh one is
# built from the tree into a temporary folder, reusing what `bazel test`
# built (deploy/test.sh does this). Ends with the line
# "check-wheel: N passed, N failed, N skipped" (pytest's counts, plus the
# example and the console scripts as one check each) and exits non-zero on
# any failure. Without PyPI (for the wheel tools) it skips, saying why.
set -uo pipefail
cd "$(dirname "$0")/.."

python=/usr/bin/python3
pypi_torch=0
fresh=0
while [ $# -gt 0 ]; do
  case "$1" in
    --python) python="$2"; shift 2 ;;
    --pypi-torch) pypi_torch=1; shift ;;
    --fresh) fresh=1; shift ;;
    *) echo "usage: $0 [--python PATH] [--pypi-torch] [--fresh]" >&2; exit 2 ;;
  esac
done
version=$(tr -d '[:space:]' < VERSION)
tag=$("$python" -c 'import sys; print("cp%d%d" % sys.version_info[:2])')
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
wheels=dist/wheels
build=(--python "$python")
if [ "$fresh" = 1 ]; then
  wheels="$work/wheels"
  build+=(--mode fastbuild)
fi
wheel=$(ls "$wheels"/sonde-"$version"-"$tag"-*.whl 2>/dev/null | head -1)
if [ -z "$wheel" ]; then
  bash deploy/build-wheels.sh "$wheels" "${build[@]}" >"$work/build.log" 2>&1
  rc=$?
  if [ "$rc" != 0 ] && grep -q '^build-wheels: no-pypi:' "$work/build.log"; then
    echo "check-wheel: skipped: the wheel tools cannot be installed from PyPI"
    echo "check-wheel: 0 passed, 0 failed, 1 skipped"
    exit 0
  elif [ "$rc" != 0 ]; then
    tail -30 "$work/build.log"
    echo "check-wheel: building the wheel failed"
    echo "check-wheel: 0 passed, 1 failed, 0 skipped"
    exit 1
  fi
  wheel=$(ls "$wheels"/sonde-"$version"-"$tag"-*.whl 2>/dev/null | head -1)
  if [ -z "$wheel" ]; then
    tail -30 "$work/build.log"
    echo "check-wheel: build-wheels.sh made no $tag wheel in $wheels"
    echo "check-wheel: 0 passed, 1 failed, 0 skipped"
    exit 1
  fi
fi
echo "check-wheel: $(basename "$wheel") ($(du -h "$wheel" | cut -f1))"
venv="$work/venv"
if [ "$pypi_torch" = 1 ]; then
  "$python" -m venv "$venv"
  start=$(date +%s)
  "$venv/bin/pip" install -q torch numpy scikit-learn pytest || exit 1
  echo "check-wheel: torch and friends from PyPI installed in $(( $(date +%s) - start )) s," \
       "$(du -sh "$venv" | cut -f1) in the venv"
else
  # Debian's torch, numpy, scikit-learn and pytest, seen through the venv.
  "$python" -m venv --system-site-packages "$venv"
fi
"$venv/bin/pip" install -q "$wheel" || exit 1
py="$venv/bin/python"
echo "check-wheel: $("$py" -c 'import sys, torch, sonde; print("Python %s, torch %s, sonde %s from %s" % (sys.version.split()[0], torch.__version__, sonde.__version__, sonde.__file__))')"

# Hooks spool into this run's folder, never the user's ~/.cache.
export SONDE_SPOOL_DIR="$work/spool"
passed=0
failed=0
check() {  # one named check: a command that must succeed
  local name="$1"; shift
  if "$@" >"$work/out" 2>&1; then
    passed=$((passed + 1)); echo "check-wheel: ok   $name"
  else
    failed=$((failed + 1)); echo "check-wheel: FAIL $name"; tail -20 "$work/out"
  fi
}
check "sonde-collector --help" sh -c "'$venv/bin/sonde-collector' --help | grep -q -- --data_dir"
check "python -m sonde.collector --help" sh -c "'$py' -m sonde.collector --help | grep -q -- --listen"
check "sonde --help" sh -c "'$venv/bin/sonde' --help 2>&1 | grep -q rule-catalog"
# The digits example, with the collector the wheel ships.
check "examples/pytorch_digits.py --embedded" \
  env PYTHONPATH=examples "$py" examples/pytorch_digits.py --embedded --epochs 2

# The Python test suite against the installed package: only the pytest
# plugin comes from the tree (client/python/testing), never `sonde` itself.
export PYTHONDONTWRITEBYTECODE=1
PYTHONPATH=client/python/testing timeout 1800 "$py" -m pytest -p no:cacheprovider -p sonde_pytest -q \
  --rootdir="$PWD" -c /dev/null client/python/tests --junitxml="$work/junit.xml" \
  > "$work/pytest" 2>&1
pytest_rc=$?
grep -E '^(FAILED|ERROR) ' "$work/pytest" | head -20
tail -1 "$work/pytest"
read -r p f s < <("$py" - "$work/junit.xml" <<'EOF'
import sys
import xml.etree.ElementTree as ET
try:
    root = ET.parse(sys.argv[1]).getroot()
except (OSError, ET.ParseError):
    print(0, 1, 0)  # pytest wrote no report: one failure
    sys.exit()
suites = [root] if root.tag == "testsuite" else list(root)
t = sum(int(s.get("tests", 0)) for s in suites)
f = sum(int(s.get("failures", 0)) + int(s.get("errors", 0)) for s in suites)
s = sum(int(x.get("skipped", 0)) for x in suites)
print(t - f - s, f, s)
EOF
)
passed=$((passed + p))
failed=$((failed + f))
# pytest failing with no failed case in its report (killed by the timeout,
# an internal error, nothing collected) is one failure, never a pass.
if [ "$pytest_rc" != 0 ] && [ "$f" -eq 0 ]; then
  echo "check-wheel: pytest exited $pytest_rc with no failed case in its report"
  failed=$((failed + 1))
fi
echo "check-wheel: $passed passed, $failed failed, $s skipped"
[ "$failed" -eq 0 ]
