#!/usr/bin/env bash
# Packs the GPU measurements (issues 14 and 15: gpu_check, the GPU tests,
# the GPU training benchmark) for a lent GPU machine, which has the driver
# and CUDA but none of Debian's libraries and no Bazel.
#
#   bash deploy/gpu-pack.sh
#   # then, with the device tool:
#   #   run(command="tar -xJf .gpu.tar.xz && bash .gpu/run.sh", carry=[".gpu.tar.xz"])
#   # each binary's output comes back as $OUT/<name>.txt, nvidia-smi -L first
#
# The bundle (.gpu/, binaries and their shared libraries) is about 61 MiB,
# which with the tracked files passes the device tool's 64 MiB limit on
# what travels; compressed it is about 15 MiB. Both paths are ignored by
# git (.git/info/exclude). GPU_BUNDLE names the bundling script
# (default: the workplace's ../shared/tools/gpu-bundle.sh).
set -euo pipefail
root=$(git rev-parse --show-toplevel)
cd "$root"
bundle=${GPU_BUNDLE:-$root/../shared/tools/gpu-bundle.sh}
[ -x "$bundle" ] || { echo "gpu-pack: no bundling script at $bundle (set GPU_BUNDLE)" >&2; exit 2; }
"$bundle" //tests/bench:gpu_training_bench //cuda:gpu_check //cuda:device_stats_test \
  //tests:device_path_test //tests:device_capture_test
exclude="$(git rev-parse --git-dir)/info/exclude"
grep -qx '/.gpu.tar.xz' "$exclude" 2>/dev/null || echo '/.gpu.tar.xz' >> "$exclude"
tar -cJf .gpu.tar.xz .gpu
du -h .gpu.tar.xz
echo 'gpu-pack: run(command="tar -xJf .gpu.tar.xz && bash .gpu/run.sh", carry=[".gpu.tar.xz"])'
