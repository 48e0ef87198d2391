#!/usr/bin/env bash
# Installs what is missing, builds everything, runs every test, and ends
# with a line "N passed, N failed, N skipped" counting GoogleTest and pytest
# cases, every shard of sharded targets included (a test target
# that fails without reporting cases counts as one failure).
#
# Then the layering (deploy/check-layers.py: no folder includes one above
# it; what must not link gRPC or the rules does not), and what users
# install: deploy/check-wheel.sh --fresh builds the `sonde` wheel for
# Debian's Python from this tree, installs it into a fresh venv and runs
# the digits example and the Python suite against the installed package.
# Both add their counts. SONDE_SKIP_WHEEL_CHECK=1 leaves the wheel out.
set -uo pipefail
cd "$(dirname "$0")/.."
bash deploy/install-deps.sh || exit 1

log=$(mktemp)
bazel test //... --test_output=errors "$@" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}

testlogs=$(bazel info bazel-testlogs 2>/dev/null)
passed=0
failed=0
skipped=0
while read -r target status; do
  dir="$testlogs/${target#//}"
  dir="${dir/://}"
  t=0; f=0; s=0
  # A sharded target writes one report per shard.
  for xml in "$dir/test.xml" "$dir"/shard_*_of_*/test.xml; do
    [ -f "$xml" ] || continue
    # The first <testsuites ...> element carries the totals (GoogleTest);
    # pytest leaves it bare and puts them on its one <testsuite ...>.
    head=$(grep -m1 -o '<testsuites[^>]*>' "$xml" || true)
    if ! grep -q ' tests="' <<<"$head"; then
      head=$(grep -m1 -o '<testsuite [^>]*>' "$xml" || true)
    fi
    xt=$(sed -n 's/.* tests="\([0-9]*\)".*/\1/p' <<<"$head")
    fl=$(sed -n 's/.* failures="\([0-9]*\)".*/\1/p' <<<"$head")
    er=$(sed -n 's/.* errors="\([0-9]*\)".*/\1/p' <<<"$head")
    xs=$(grep -c '<skipped' "$xml" || true)
    t=$((t + ${xt:-0})); f=$((f + ${fl:-0} + ${er:-0})); s=$((s + ${xs:-0}))
  done
  if [ "$status" != "PASSED" ] && [ "$f" -eq 0 ]; then f=1; fi
  passed=$((passed + t - f - s))
  failed=$((failed + f))
  skipped=$((skipped + s))
done < <(sed -n 's#^\(//[^ ]*\) \+\((cached) \)\?\(PASSED\|FAILED\|TIMEOUT\|NO STATUS\|FLAKY\|FAILED TO BUILD\|INCOMPLETE\).*#\1 \3#p' "$log" | sed 's/ NO STATUS$/ NO_STATUS/; s/ FAILED TO BUILD$/ FAILED_TO_BUILD/')

if [ "$rc" -ne 0 ] && [ "$failed" -eq 0 ]; then failed=1; fi

# Runs a stage that ends with "<name>: N passed, N failed, N skipped" and
# adds its counts (a stage that fails or prints no counts is a failure).
stage() {
  local name=$1
  shift
  "$@" 2>&1 | tee "$log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
  local counts
  counts=$(sed -n "s/^$name: \([0-9]*\) passed, \([0-9]*\) failed, \([0-9]*\) skipped\$/\1 \2 \3/p" "$log" | tail -1)
  if [ -z "$counts" ]; then
    failed=$((failed + 1)); rc=1
    return
  fi
  local p f s
  read -r p f s <<<"$counts"
  passed=$((passed + p)); failed=$((failed + f)); skipped=$((skipped + s))
}

# The tree's layering: no folder includes one above it; storage/, rules/,
# math/ and stats/ do not link gRPC; the hook links no rule.
stage check-layers /usr/bin/python3 deploy/check-layers.py
if [ "${SONDE_SKIP_WHEEL_CHECK:-0}" != 1 ]; then
  stage check-wheel bash deploy/check-wheel.sh --fresh
fi
rm -f "$log"
echo "${passed} passed, ${failed} failed, ${skipped} skipped"
exit "$rc"
