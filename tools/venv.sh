#!/usr/bin/env bash
# Creates (once) the virtualenv used by the golden-data and benchmark scripts, with the
# pinned tools/requirements.txt, and prints its python. llama-cpp-python compiles
# llama.cpp from source for this CPU (GGML_NATIVE), which takes several minutes.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cache=${QEVICT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/qevict}
venv="$cache/venv"
stamp="$venv/.requirements.sha256"
want=$(sha256sum "$here/requirements.txt" | cut -d' ' -f1)
if [ ! -x "$venv/bin/python" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "venv: installing tools/requirements.txt into $venv (llama.cpp builds from source) ..." >&2
  python3 -m venv "$venv" >&2
  CMAKE_ARGS="-DGGML_NATIVE=ON" CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) \
    "$venv/bin/pip" install --disable-pip-version-check -q -r "$here/requirements.txt" >&2
  echo "$want" > "$stamp"
fi
echo "$venv/bin/python"
