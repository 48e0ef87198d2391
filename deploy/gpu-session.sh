#!/usr/bin/env bash
# A GPU session's measurements in one call of the device tool: the GPU
# tests, gpu_check, the GPU training benchmark, the PyTorch GPU benchmark
# and an Nsight Compute profile of the statistics kernels, most important
# first, each under a time cap and all under one budget, so that a lease of
# 15 minutes (the machine's start included) brings back every figure it has
# time for, and what it had no time for is said, not lost.
#
#   bash deploy/gpu-pack.sh          # here: builds and packs .gpu.tar.xz
#   # then, with the device tool:
#   run(command="bash deploy/gpu-session.sh", carry=[".gpu.tar.xz"], timeout_s=480)
#
# Outputs, in $OUT (at most 8 files come back): env.txt, tests.txt,
# gpu_check.txt, training.txt, torch.txt, ncu.txt and summary.txt; the
# summary is rewritten after every part (a call cut short keeps what ran)
# and printed last, so the reply's tail holds it. Each part's exit
# status and seconds are in the summary; a part with too little time left
# is skipped and says so.
#
# SONDE_GPU_BUDGET: seconds for all parts (default 400; keep it under the
# call's timeout_s). SONDE_GPU_PARTS: the parts to run, in order (default
# "env tests gpu_check training torch ncu"). Runs on a machine without a
# GPU too: every part then says there is none (how it is checked here).
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
out=${OUT:-/tmp/sonde-gpu-out}
mkdir -p "$out"
budget=${SONDE_GPU_BUDGET:-400}
parts=${SONDE_GPU_PARTS:-"env tests gpu_check training torch ncu"}
start=$SECONDS
summary=$out/summary.txt
parts_log=$(mktemp)  # each part's line; the summary ends with them
: > "$summary"

# The carried archive is the newest build: a warm machine may still hold
# the folders a call before unpacked.
if [ -f .gpu.tar.xz ]; then
  rm -rf .gpu .gpu-torch
  tar -xJf .gpu.tar.xz || { echo "gpu-session: cannot unpack .gpu.tar.xz" | tee -a "$summary"; exit 2; }
fi
[ -d .gpu ] || { echo "gpu-session: no .gpu/ (run deploy/gpu-pack.sh here and carry .gpu.tar.xz)" | tee -a "$summary"; exit 2; }
# The bundle's libraries (Debian's) go only to the bundle's binaries (and
# to ncu, which starts one), ahead of the machine's own paths, which stay
# for what the bundle lacks (the driver's libraries); nvidia-smi and
# python keep the machine's alone.
gpu_libs=$root/.gpu/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export TEST_TMPDIR=/tmp/sonde-gpu-tests PYTHONUNBUFFERED=1
mkdir -p "$TEST_TMPDIR"
echo "gpu-session: budget ${budget} s, parts: $parts" | tee -a "$parts_log"

# part NAME CAP COMMAND...: runs COMMAND (a function of this script) with
# its output in $out/NAME.txt, for at most CAP seconds or what is left of
# the budget, and records the exit status (124: out of time).
failed=0
failed_parts=""
part() {
  local name=$1 cap=$2
  shift 2
  local left=$((budget - (SECONDS - start)))
  local limit=$((cap < left ? cap : left))
  if [ "$limit" -lt 15 ]; then
    echo "== $name: skipped, ${left} s of the budget left" | tee -a "$parts_log"
    return
  fi
  local t0=$SECONDS rc
  timeout -k 10 "$limit" bash -c "gpu_libs='$gpu_libs'; $(declare -f run_gpu "$@"); $*" \
    > "$out/$name.txt" 2>&1
  rc=$?
  [ "$rc" -eq 0 ] || { failed=1; failed_parts="$failed_parts $name"; }
  local note=""
  [ "$rc" -eq 124 ] && note=" (stopped at its ${limit} s limit)"
  echo "== $name: exit ${rc} after $((SECONDS - t0)) s${note}" | tee -a "$parts_log"
  write_summary
}

# A binary of the bundle, with the bundle's libraries.
run_gpu() { LD_LIBRARY_PATH=$gpu_libs "$@"; }

env_part() {
  nvidia-smi -L
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem,clocks.max.sm,temperature.gpu,power.draw --format=csv
  nvidia-smi --query-compute-apps=pid,used_memory --format=csv
  uname -r
  nproc
  python3 -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__, torch.cuda.get_device_name() if torch.cuda.is_available() else "no cuda")'
  command -v ncu && ncu --version | tail -1
  ls -d /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null
  true
}

# Where nvidia-smi sees a GPU, a binary that finds none fails its part:
# the GPU tests skip and gpu_check exits 0 without one, by design, for
# machines that have none, which would otherwise pass here unnoticed.
tests_part() {
  local rc=0 t
  for t in device_stats_test device_path_test device_capture_test; do
    echo "=== $t"
    run_gpu .gpu/$t > "/tmp/sonde-$t.txt" 2>&1 || rc=1
    cat "/tmp/sonde-$t.txt"
    # The skips that say no GPU was usable (a case for machines without one
    # skips, rightly, where there is one).
    if nvidia-smi -L > /dev/null 2>&1 &&
        grep -q -E 'no GPU: |has no CUDA support' "/tmp/sonde-$t.txt"; then
      echo "=== $t skipped cases on a machine with a GPU: the binary found no usable device"
      rc=1
    fi
  done
  return $rc
}

gpu_check_part() {
  run_gpu .gpu/gpu_check --repeats=20 | tee /tmp/sonde-gpu_check.txt
  local rc=${PIPESTATUS[0]}
  if nvidia-smi -L > /dev/null 2>&1 && grep -q 'no GPU to check' /tmp/sonde-gpu_check.txt; then
    echo "gpu_check found no usable device on a machine with a GPU"
    return 1
  fi
  return "$rc"
}

# Ten measured rounds (the default): values100 then saves at step 100,
# inside a measured round (six rounds would have saved only at step 0).
training_part() { run_gpu .gpu/gpu_training_bench; }

torch_part() {
  local site
  site=$(mktemp -d)/site
  python3 -m pip install -q --no-deps --no-index --no-compile --no-cache-dir --upgrade \
    --target "$site" .gpu-torch/wheels/*.whl || return 1
  export PYTHONPATH=$site
  local rc=0
  # The MLP of issue 14 (4.8 ms a step on an H100), then with a batch four
  # times larger, near the 20 ms step of the issue's 1% goal.
  # Rounds of 20 steps: 6 rounds run steps 0..139 and 5 run 0..119, so
  # values100's step 100 is saved inside a measured round.
  echo "=== batch 512"
  python3 examples/bench/torch_gpu_bench.py --rounds 6 || rc=1
  echo "=== batch 2048"
  python3 examples/bench/torch_gpu_bench.py --rounds 5 --batch 2048 \
    --modes stats,stats_deferred,values100 || rc=1
  return $rc
}

ncu_part() {
  local ncu
  ncu=$(command -v ncu || ls -d /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | tail -1)
  [ -n "$ncu" ] || { echo "no ncu on this machine (PATH, /usr/local/cuda/bin, /opt/nvidia/nsight-compute)"; return 1; }
  echo "ncu: $ncu"
  # --clock-control none: the card's clocks as found (never lock or change them).
  # Both kernels of a batch (the merge's share of a 64 MiB tensor's time is
  # what decides whether it should move into the partials' last block):
  # 64 and 256 MiB of F32, statistics, with histograms and warp-aggregated,
  # each a warm-up and one timed batch (24 launches).
  LD_LIBRARY_PATH=$gpu_libs "$ncu" --clock-control none \
    --kernel-name regex:'Stats(Partials|Merge)Kernel' --launch-count 24 \
    --section SpeedOfLight --section Occupancy --section LaunchStats \
    --section MemoryWorkloadAnalysis \
    .gpu/gpu_check --no_conformance --no_step --no_snapshots --chunk_sweep= --sizes=64,256 \
    --dtypes=f32 --repeats=1
}

# The figures, in the reply's tail (about 12,000 characters): each part's
# lines that carry results (the whole files are in $out). Written again
# after every part, so that a call cut short still brings back what ran.
write_summary() {
  {
    echo
    echo "######## summary (whole outputs in \$OUT) ########"
    local f
    f=$out/env.txt; [ -f "$f" ] && head -c 1200 "$f"
    f=$out/tests.txt; [ -f "$f" ] && grep -E '^=== |^\[  PASSED  \] [0-9]+ tests?|^\[  FAILED  \]|^\[  SKIPPED \] [0-9]+ tests?,|^\[==========\] [0-9]+ tests? from .* ran' "$f" | head -40
    f=$out/gpu_check.txt; [ -f "$f" ] && grep -v -E '^FAIL ' "$f" | head -c 5000
    f=$out/training.txt; [ -f "$f" ] && tail -c 4000 "$f"
    f=$out/torch.txt; [ -f "$f" ] && grep -E '^(=== |device:|model:|host time|copy|none|stats|values|FAILED|checks)' "$f" | head -c 3500
    # ncu: a line a kernel profiled.
    f=$out/ncu.txt; [ -f "$f" ] && awk '
      function flush() { if (k != "") printf "%-8s grid %-9s %10s %-4s DRAM %6s%%  occupancy %6s%%  registers %s\n", k, g, d, du, dram, occ, regs }
      /Stats(Partials|Merge)Kernel/ && /\)x\(/ {
        flush(); k = ($0 ~ /StatsMerge/) ? "merge" : "partials"; g = "?"
        if (match($0, /\([0-9]+, [0-9]+, [0-9]+\)x/)) { g = substr($0, RSTART + 1); sub(/,.*/, "", g) }
        d = du = dram = occ = regs = "?"
      }
      $1 == "Duration" { du = $2; d = $NF }
      $1 == "DRAM" && $2 == "Throughput" { dram = $NF }
      $1 == "Achieved" && $2 == "Occupancy" { occ = $NF }
      $1 == "Registers" && $2 == "Per" { regs = $NF }
      END { flush() }' "$f"
    # The end of what each failed part printed (its reason, usually).
    local p
    for p in $failed_parts; do
      echo "-- end of $p.txt"
      tail -n 8 "$out/$p.txt" | cut -c 1-300
    done
    echo
    cat "$parts_log"
  } > "$summary.new"
  mv "$summary.new" "$summary"
}

for p in $parts; do
  case $p in
    env) part env 30 env_part ;;
    tests) part tests 120 tests_part ;;
    gpu_check) part gpu_check 120 gpu_check_part ;;
    training) part training 150 training_part ;;
    torch) part torch 150 torch_part ;;
    ncu) part ncu 90 ncu_part ;;
    *) echo "== $p: unknown part" | tee -a "$parts_log"; failed=1 ;;
  esac
done

write_summary
cat "$summary"
exit $failed
