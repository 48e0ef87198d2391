#!/usr/bin/env bash
# Installs every Debian package Sonde needs to build and test. Safe to run
# again: when everything is present it changes nothing and needs no network.
set -euo pipefail

PACKAGES=(
  bazel-bootstrap bazel-platforms g++
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  librocksdb-dev libabsl-dev libre2-dev libgoogle-glog-dev libgflags-dev nlohmann-json3-dev
  libcurl4-openssl-dev python3-grpcio python3-protobuf python3-numpy
  python3-dev pybind11-dev python3-torch python3-pytest python3-sklearn python3-matplotlib
  libgtest-dev libgmock-dev libbenchmark-dev
  clang libclang-rt-dev
  etcd-server golang-etcd-server-dev nats-server libnats-dev python3-yaml
  chromium
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#PACKAGES[@]} packages present"
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
