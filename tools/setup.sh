#!/usr/bin/env bash
# Sets everything up on a fresh Debian 12 machine: installs the Debian packages the build
# needs (when missing), configures and builds qevict (Release, build/), fetches the models
# (the default SmolLM2 and the second family's Qwen2.5-Coder-0.5B, for the e2e tests).
# Prints the default model's path on its last line. Safe to run again.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

pkgs=(build-essential cmake pkg-config python3 python3-pip python3-venv ca-certificates
      libhwy-dev libfmt-dev pybind11-dev python3-dev libcli11-dev nlohmann-json3-dev libgtest-dev libgmock-dev libbenchmark-dev zlib1g-dev libcpp-httplib-dev
      jargon-text wamerican)  # the last two: haystack prose and word list of `qevict eval`
tools/apt_install.sh setup "${pkgs[@]}"

jobs=$(nproc 2>/dev/null || echo 2)
# The models download (network) while the build compiles (CPU); the default model's path is
# printed last, as before.
path_file=$(mktemp)
(tools/fetch_model.sh qwen2.5-coder-0.5b >&2 && tools/fetch_model.sh >"$path_file") &
fetch_pid=$!
trap 'kill "$fetch_pid" 2>/dev/null || true; rm -f "$path_file"' EXIT
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >&2
cmake --build build -j"$jobs" >&2
if ! wait "$fetch_pid"; then
  echo "setup: fetching the models failed (tools/fetch_model.sh above)" >&2
  exit 1
fi
tail -n1 "$path_file"
