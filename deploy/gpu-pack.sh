#!/usr/bin/env bash
# Packs the GPU measurements (issues 14 and 15) for a lent GPU machine,
# which has the driver, CUDA, Python 3.12 and torch 2.x, but none of
# Debian's libraries, no Bazel and no network:
#   - .gpu/: gpu_check, the GPU tests and the GPU training benchmark with
#     their shared libraries (../shared/tools/gpu-bundle.sh), and
#   - .gpu-torch/wheels: the sonde wheel for CPython 3.12 with the grpcio,
#     protobuf and typing_extensions wheels it needs (the machine's own
#     versions may differ), which deploy/gpu-session.sh installs into a
#     scratch folder to run examples/bench/torch_gpu_bench.py there.
#
#   bash deploy/gpu-pack.sh [--no-torch]
#   # then, with the device tool, everything in one call (a lease is 15
#   # minutes, the machine's start included; deploy/gpu-session.sh says how
#   # the parts share the time):
#   #   run(command="bash deploy/gpu-session.sh", carry=[".gpu.tar.xz"], timeout_s=480)
#   # or one binary: tar -xJf .gpu.tar.xz && cd .gpu && LD_LIBRARY_PATH=$PWD/lib ./gpu_check
#
# Unpacked, .gpu/ is about 61 MiB, which with the tracked files passes the
# device tool's 64 MiB limit on what travels; so both folders travel as one
# xz archive (about 15 MiB, plus about 27 MiB of wheels). All three paths
# are ignored by git (.git/info/exclude). GPU_BUNDLE names the bundling
# script (default: the workplace's ../shared/tools/gpu-bundle.sh); PYTHON312
# the CPython 3.12 to build the wheel for (default: pyenv's).
set -euo pipefail
root=$(git rev-parse --show-toplevel)
cd "$root"
torch=1
[ "${1:-}" = "--no-torch" ] && torch=0
bundle=${GPU_BUNDLE:-$root/../shared/tools/gpu-bundle.sh}
[ -x "$bundle" ] || { echo "gpu-pack: no bundling script at $bundle (set GPU_BUNDLE)" >&2; exit 2; }
mkdir -p "$(git rev-parse --git-dir)/info"
exclude="$(git rev-parse --git-dir)/info/exclude"
for p in /.gpu.tar.xz /.gpu-torch/; do
  grep -qx "$p" "$exclude" 2>/dev/null || echo "$p" >> "$exclude"
done
"$bundle" //tests/bench:gpu_training_bench //cuda:gpu_check //cuda:device_stats_test \
  //tests:device_path_test //tests:device_capture_test
rm -rf .gpu-torch
if [ "$torch" = 1 ]; then
  py=${PYTHON312:-$(ls -d "$HOME"/.pyenv/versions/3.12.*/bin/python3 2>/dev/null | tail -1)}
  [ -x "$py" ] || { echo "gpu-pack: no CPython 3.12 (set PYTHON312, or --no-torch)" >&2; exit 2; }
  mkdir -p .gpu-torch/wheels
  bash deploy/build-wheels.sh .gpu-torch/wheels --python "$py"
  # What the wheel requires besides numpy and torch, which the machine has
  # (grpcio needs typing_extensions, which torch needs too: carried anyway).
  "$py" -m pip download -q --only-binary=:all: --no-deps -d .gpu-torch/wheels \
    'grpcio>=1.51' 'protobuf>=4.21' typing_extensions
  tar -cJf .gpu.tar.xz .gpu .gpu-torch
else
  tar -cJf .gpu.tar.xz .gpu
fi
du -h .gpu.tar.xz
# What travels is the archive plus the tracked and unignored files: keep it
# under the device tool's 64 MiB.
tracked=$(git ls-files -z --cached --others --exclude-standard |
  xargs -0 -r stat -c %s 2>/dev/null | awk '{ n += $1 } END { print n + 0 }')
total=$(( $(stat -c %s .gpu.tar.xz) + ${tracked:-0} ))
echo "gpu-pack: $(( total >> 20 )) MiB travel with the working tree (limit 64 MiB)"
[ "$total" -lt $(( 64 << 20 )) ] || { echo "gpu-pack: too big to travel" >&2; exit 1; }
echo 'gpu-pack: run(command="bash deploy/gpu-session.sh", carry=[".gpu.tar.xz"], timeout_s=480)'
exit 0
