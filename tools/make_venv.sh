#!/usr/bin/env bash
# Creates (once) a virtualenv in the qevict cache from a pinned requirements file and prints its
# python. The file's sha256 is stamped in the venv: when the pins change, it is installed again.
# Usage: make_venv.sh NAME REQUIREMENTS [WHAT]   (WHAT: said while installing, e.g. its size)
# The venv scripts beside their requirements (tools/venv.sh, tools/serve/venv.sh,
# tools/faithfulness/venv.sh) call this; environment (CMAKE_ARGS, PIP_FIND_LINKS) passes through.
set -euo pipefail
name=$1
req=$2
what=${3:-}
cache=${QEVICT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/qevict}
venv="$cache/$name"
stamp="$venv/.requirements.sha256"
want=$(sha256sum "$req" | cut -d' ' -f1)
if [ ! -x "$venv/bin/python" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "$name: installing $req into $venv${what:+ ($what)} ..." >&2
  python3 -m venv "$venv" >&2
  "$venv/bin/pip" install --disable-pip-version-check -q \
    ${PIP_FIND_LINKS:+--find-links "$PIP_FIND_LINKS"} -r "$req" >&2
  echo "$want" > "$stamp"
fi
echo "$venv/bin/python"
