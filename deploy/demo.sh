#!/usr/bin/env bash
# The main job: installs what is missing, builds, and runs the demos, each
# with an embedded collector:
#   1. examples/demo.cc (C++): the seed blog's linear model, healthy and with
#      the blog's bad hyperparameters (stopped by ExplodingTensor);
#   2. examples/pytorch_digits.py (PyTorch, Debian's /usr/bin/python3): a CNN
#      on scikit-learn's digits, healthy (every rule NoIssuesFound; profiled,
#      its HTML report written to $TMPDIR/sonde-digits-report.html) and with
#      a learning rate of 50 (stopped by the first rule that sees it).
# Extra arguments go to the C++ demo, e.g. --collector=127.0.0.1:7070.
# Exits non-zero if any run's outcome is not what it should be.
set -euo pipefail
cd "$(dirname "$0")/.."
bash deploy/install-deps.sh
bazel build //examples:demo //examples:pytorch_digits
bazel run //examples:demo -- "$@"
echo
echo "== PyTorch: a CNN on scikit-learn's digits, healthy, profiled =="
bazel run //examples:pytorch_digits -- --embedded --config healthy \
  --report "${TMPDIR:-/tmp}/sonde-digits-report.html"
echo
echo "== PyTorch: the same CNN with a learning rate of 50 =="
bazel run //examples:pytorch_digits -- --embedded --config exploding_lr
