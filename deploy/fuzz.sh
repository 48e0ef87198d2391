#!/usr/bin/env bash
# Builds Sonde's libFuzzer binaries (clang, ASan, UBSan: --config=fuzz) and
# fuzzes each target for N seconds from its seed corpus in tests/fuzz/corpus.
# Prints executions, exec/s and coverage per target; exits non-zero if any
# fuzzer found a crash, a leak, a timeout or a violated property.
#
#   deploy/fuzz.sh                 30 s per target (chunks, keys, ingest, patterns)
#   deploy/fuzz.sh 1200 ingest     a long run of one target
#
# The build uses an output base of its own ($SONDE_FUZZ_OUTPUT_BASE, default
# ~/.cache/sonde-fuzz/bazel): clang's configuration never evicts the gcc
# build's, and it does not wait for the workspace's Bazel lock. It creates no
# bazel-* symlinks in the work tree.
#
# What a run leaves, per target, in $SONDE_FUZZ_DIR (default
# ~/.cache/sonde-fuzz/<target>): corpus/ (inputs the fuzzer found
# interesting; the committed seeds are read, never written), findings/
# (crash-*, leak-*, timeout-*, oom-* inputs) and log. To keep a finding as a
# regression, fix the bug, then copy the input to tests/fuzz/corpus/<target>/
# under a name that says what it was.
set -uo pipefail
cd "$(dirname "$0")/.."

seconds="${1:-30}"
shift || true
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then targets=(chunks keys ingest patterns); fi

for tool in clang clang++; do
  if ! command -v "$tool" >/dev/null; then
    echo "fuzz: $tool is missing (deploy/install-deps.sh installs it)" >&2
    exit 1
  fi
done

output_base="${SONDE_FUZZ_OUTPUT_BASE:-$HOME/.cache/sonde-fuzz/bazel}"
work="${SONDE_FUZZ_DIR:-$HOME/.cache/sonde-fuzz}"
bazel_fuzz=(bazel --output_base="$output_base")
labels=()
for t in "${targets[@]}"; do labels+=("//tests/fuzz:${t}_fuzzer"); done

mkdir -p "$work"
start=$(date +%s)
if ! "${bazel_fuzz[@]}" build --config=fuzz --symlink_prefix=/ "${labels[@]}" \
    >"$work/build.log" 2>&1; then
  grep -v 'Cannot export local symbol' "$work/build.log" | tail -40 >&2
  echo "fuzz: build failed (log: $work/build.log)" >&2
  exit 1
fi
echo "fuzz: built ${#labels[@]} fuzzer(s) in $(( $(date +%s) - start )) s"
bin="$("${bazel_fuzz[@]}" info --config=fuzz bazel-bin 2>/dev/null)"

found=0
for t in "${targets[@]}"; do
  dir="$work/$t"
  mkdir -p "$dir/corpus" "$dir/findings"
  before=$(find "$dir/findings" -type f | wc -l)
  # The ingest target's RocksDB directories go here, and away after the run.
  scratch="$(mktemp -d)"
  extra=()
  # Measured: with libFuzzer's entropic schedule the ingest target spends
  # 60% of its time in the schedule's bookkeeping; the plain schedule runs
  # 3-5x the inputs and reaches more coverage in the same time.
  if [ "$t" = ingest ]; then extra=(-entropic=0); fi
  TMPDIR="$scratch" LSAN_OPTIONS="suppressions=$PWD/tests/fuzz/lsan_suppressions.txt" \
    "$bin/tests/fuzz/${t}_fuzzer" "${extra[@]}" \
    -max_total_time="$seconds" -timeout=30 -max_len=8192 \
    -print_final_stats=1 -artifact_prefix="$dir/findings/" \
    "$dir/corpus" "tests/fuzz/corpus/$t" >"$dir/log" 2>&1
  rc=$?
  rm -rf "$scratch"
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$dir/log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$dir/log" | tail -1)
  cov=$(grep -o 'cov: [0-9]*' "$dir/log" | tail -1 | cut -d' ' -f2)
  ft=$(grep -o 'ft: [0-9]*' "$dir/log" | tail -1 | cut -d' ' -f2)
  corpus=$(find "$dir/corpus" -type f | wc -l)
  findings=$(( $(find "$dir/findings" -type f | wc -l) - before ))
  status="nothing found"
  if [ "$rc" -ne 0 ] || [ "$findings" -gt 0 ]; then
    status="FOUND SOMETHING (exit $rc): see $dir/log and $dir/findings/"
    found=1
    grep -m3 -E 'ERROR: |FUZZ PROPERTY VIOLATED|runtime error' "$dir/log" | sed 's/^/    /'
  fi
  echo "fuzz: $t: ${seconds} s, ${execs:-0} executions, ${rate:-0} exec/s, cov ${cov:-?}, ft ${ft:-?}, corpus ${corpus} files: $status"
done
exit "$found"
