#!/usr/bin/env bash
# Reads ptxas's resource report of cuda/stats_kernels.cu (written by the
# //cuda:stats_kernels_obj build) and fails when the statistics kernels
# spill registers or use a stack frame on any architecture: local memory in
# the kernel's loop would cost the bandwidth it is built for.
set -euo pipefail
report=$1
[ -s "$report" ] || { echo "no resource report at $report" >&2; exit 1; }
awk '
  /Compiling entry function/ {
    name = $0; sub(/.*function \047/, "", name); sub(/\047.*/, "", name)
    arch = $0; sub(/.*for \047/, "", arch); sub(/\047.*/, "", arch)
    kernel = (name ~ /Stats(Partials|Merge)Kernel/) ? (name ~ /Partials/ ? "partials" : "merge") : ""
  }
  kernel != "" && /bytes stack frame/ {
    checked++
    if ($0 !~ /^ *0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads/) {
      printf "FAIL %s kernel on %s: %s\n", kernel, arch, $0; bad++
    }
  }
  kernel != "" && /Used [0-9]+ registers/ {
    regs = $0; sub(/.*Used /, "", regs); sub(/ registers.*/, "", regs)
    printf "%s kernel on %s: %s registers\n", kernel, arch, regs
  }
  END {
    if (checked == 0) { print "FAIL: no statistics kernel in the report"; exit 1 }
    if (bad > 0) exit 1
    printf "%d kernel builds without spills or stack\n", checked
  }
' "$report"
