#!/usr/bin/env bash
# Creates (once) the small virtualenv of the server's tests (pinned tools/serve/requirements.txt:
# the official openai client) and prints its python.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
exec bash "$here/../make_venv.sh" venv-serve "$here/requirements.txt"
