#!/usr/bin/env bash
# Runs pytest with Debian's /usr/bin/python3 on the given test files, with
# the runfiles' `sonde` package importable. Used by sonde_py_test.
set -euo pipefail
root="${TEST_SRCDIR:?run under bazel test}/${TEST_WORKSPACE:-sonde}"
export SONDE_RUNFILES="$root"
export PYTHONPATH="$root/client/python:$root/client/python/testing:$root${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONDONTWRITEBYTECODE=1
xml=()
if [ -n "${XML_OUTPUT_FILE:-}" ]; then xml=(--junitxml="$XML_OUTPUT_FILE" -o junit_family=xunit1); fi
cd "$root"
exec /usr/bin/python3 -m pytest -p no:cacheprovider -p sonde_pytest -q -rs \
  --rootdir="$root" -c /dev/null "${xml[@]}" "$@"
