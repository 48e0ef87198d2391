#!/usr/bin/env bash
# The main job: installs what is missing, builds, and runs the demo (an
# embedded collector plus a healthy and a diverging training run). Extra
# arguments go to the demo, e.g. --collector=127.0.0.1:7070.
set -euo pipefail
cd "$(dirname "$0")/.."
bash deploy/install-deps.sh
exec bazel run //examples:demo -- "$@"
