#!/usr/bin/env bash
# Creates (once) the small virtualenv of the server's tests (pinned tools/serve/requirements.txt:
# the official openai client) and prints its python.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cache=${QEVICT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/qevict}
venv="$cache/venv-serve"
stamp="$venv/.requirements.sha256"
want=$(sha256sum "$here/requirements.txt" | cut -d' ' -f1)
if [ ! -x "$venv/bin/python" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "venv-serve: installing tools/serve/requirements.txt into $venv ..." >&2
  python3 -m venv "$venv" >&2
  "$venv/bin/pip" install --disable-pip-version-check -q -r "$here/requirements.txt" >&2
  echo "$want" > "$stamp"
fi
echo "$venv/bin/python"
