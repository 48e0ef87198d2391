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
# deploy/build-wheels.sh for that Python when missing. Ends with the line
# "check-wheel: N passed, N failed" (pytest's count, plus the example and the
# console scripts as one check each) and exits non-zero on any failure.
set -uo pipefail
cd "$(dirname "$0")/.."

python=/usr/bin/python3
pypi_torch=0
while [ $# -gt 0 ]; do
  case "$1" in
    --python) python="$2"; shift 2 ;;
    --pypi-torch) pypi_torch=1; shift ;;
    *) echo "usage: $0 [--python PATH] [--pypi-torch]" >&2; exit 2 ;;
  esac
done
version=$(tr -d '[:space:]' < VERSION)
tag=$("$python" -c 'import sys; print("cp%d%d" % sys.version_info[:2])')
wheel=$(ls dist/wheels/sonde-"$version"-"$tag"-*.whl 2>/dev/null | head -1)
if [ -z "$wheel" ]; then
  bash deploy/build-wheels.sh dist/wheels --python "$python" >/dev/null || exit 1
  wheel=$(ls dist/wheels/sonde-"$version"-"$tag"-*.whl | head -1)
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
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
PYTHONPATH=client/python/testing "$py" -m pytest -p no:cacheprovider -p sonde_pytest -q \
  --rootdir="$PWD" -c /dev/null client/python/tests --junitxml="$work/junit.xml" \
  > "$work/pytest" 2>&1
tail -3 "$work/pytest"
counts=$("$py" - "$work/junit.xml" <<'EOF'
import sys
import xml.etree.ElementTree as ET
root = ET.parse(sys.argv[1]).getroot()
suites = [root] if root.tag == "testsuite" else list(root)
t = sum(int(s.get("tests", 0)) for s in suites)
f = sum(int(s.get("failures", 0)) + int(s.get("errors", 0)) for s in suites)
s = sum(int(x.get("skipped", 0)) for x in suites)
print(t - f - s, f)
EOF
)
passed=$((passed + ${counts% *}))
failed=$((failed + ${counts#* }))
echo "check-wheel: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
