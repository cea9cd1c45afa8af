#!/usr/bin/env bash
# Creates (once) the virtualenv of the faithfulness reference side (kvpress, transformers,
# torch; tools/faithfulness/requirements.txt) and prints its python. About 3.9 GB to
# download (torch's CUDA wheels, which PyPI's Linux torch depends on), ~7 GB installed.
# Only make_golden.py needs it; CI does not (it checks the committed golden data).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cache=${QEVICT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/qevict}
venv="$cache/venv-faithfulness"
stamp="$venv/.requirements.sha256"
want=$(sha256sum "$here/requirements.txt" | cut -d' ' -f1)
if [ ! -x "$venv/bin/python" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "venv: installing tools/faithfulness/requirements.txt into $venv (~3.9 GB) ..." >&2
  python3 -m venv "$venv" >&2
  "$venv/bin/pip" install --disable-pip-version-check -q ${PIP_FIND_LINKS:+--find-links "$PIP_FIND_LINKS"} \
    -r "$here/requirements.txt" >&2
  echo "$want" > "$stamp"
fi
echo "$venv/bin/python"
