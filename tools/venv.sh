#!/usr/bin/env bash
# Creates (once) the virtualenv used by the golden-data and benchmark scripts, with the
# pinned tools/requirements.txt, and prints its python. llama-cpp-python compiles
# llama.cpp from source for this CPU (GGML_NATIVE), which takes several minutes.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CMAKE_ARGS="-DGGML_NATIVE=ON" CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) \
  exec bash "$here/make_venv.sh" venv "$here/requirements.txt" "llama.cpp builds from source"
