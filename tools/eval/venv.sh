#!/usr/bin/env bash
# Creates (once) the small virtualenv of the eval's plots (pinned tools/eval/requirements.txt:
# matplotlib and NumPy, no llama.cpp build) and prints its python.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
exec bash "$here/../make_venv.sh" venv-plot "$here/requirements.txt"
