#!/usr/bin/env bash
# Creates (once) the virtualenv of the faithfulness reference side (kvpress, transformers,
# torch; tools/faithfulness/requirements.txt) and prints its python. About 3.9 GB to
# download (torch's CUDA wheels, which PyPI's Linux torch depends on), ~7 GB installed.
# Only make_golden.py needs it; CI does not (it checks the committed golden data).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
exec bash "$here/../make_venv.sh" venv-faithfulness "$here/requirements.txt" "~3.9 GB"
