#!/usr/bin/env bash
# Runs a Python program of this workspace under Debian's /usr/bin/python3
# with the runfiles' `sonde` package importable: the launcher of
# `bazel run //examples:pytorch_digits`, `//examples:analyze_trial` and
# `//examples/bench:hook_overhead`. The first argument is the program's
# workspace-relative path; relative paths among the others are the caller's
# (bazel run starts us in the runfiles, so we go back to where it was run).
set -euo pipefail
root="${RUNFILES_DIR:-$0.runfiles}/sonde"
export SONDE_RUNFILES="$root"
export PYTHONPATH="$root/client/python:$root/examples${PYTHONPATH:+:$PYTHONPATH}"
program="$root/$1"
shift
cd "${BUILD_WORKING_DIRECTORY:-.}"
exec /usr/bin/python3 "$program" "$@"
