#!/usr/bin/env bash
# CTest entry of the server's openai-client test: skips (77) without QEVICT_TEST_MODEL.
# Usage: run_client_test.sh QEVICT_BINARY
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
if [ -z "${QEVICT_TEST_MODEL:-}" ]; then
  echo "QEVICT_TEST_MODEL is not set: skipped"
  exit 77
fi
py=$("$here/venv.sh")
exec "$py" "$here/client_test.py" "$1" "$QEVICT_TEST_MODEL"
