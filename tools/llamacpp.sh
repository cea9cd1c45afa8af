#!/usr/bin/env bash
# Builds llama.cpp's own native tools (llama-bench, llama-server, llama-perplexity), once, from
# the llama.cpp sources vendored in the PyPI sdist of llama-cpp-python — the same version the
# venv's Python binding uses (pinned once, in tools/requirements.txt) — and prints their bin
# directory on its last line. Later runs print it at once. These are the rival for speed
# tables: the native tools have no Python in their loops.
#   Release, GGML_NATIVE=ON (this CPU's instruction sets, as tools/venv.sh), no curl, static.
#   Cache folder: $QEVICT_CACHE, else ${XDG_CACHE_HOME:-~/.cache}/qevict; the build goes to
#   llama.cpp-<version>/ in it (sources in src/, build tree in build/, binaries in build/bin/).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cache=${QEVICT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/qevict}
targets=(llama-bench llama-server llama-perplexity)

die() { echo "llamacpp: $*" >&2; exit 1; }

version=$(sed -n 's/^llama-cpp-python==\([^[:space:]#]*\).*/\1/p' "$here/requirements.txt")
[ -n "$version" ] || die "no 'llama-cpp-python==VERSION' line in tools/requirements.txt"
dir="$cache/llama.cpp-$version"
bin="$dir/build/bin"
stamp="$dir/.built"

# GGML_NATIVE compiles for the CPU of the build: a cache carried to another CPU (a VM moved
# to another host, a shared home directory) could run slower than native or fault on an
# instruction it lacks. The stamp records the CPU model and flags; another CPU rebuilds.
cpu_id=$( (grep -m1 '^model name' /proc/cpuinfo; grep -m1 '^flags' /proc/cpuinfo) 2>/dev/null |
  md5sum | cut -c1-16)
built() {
  [ -f "$stamp" ] || return 1
  grep -qx "cpu $cpu_id" "$stamp" || return 1
  local t
  for t in "${targets[@]}"; do [ -x "$bin/$t" ] || return 1; done
}

if built; then
  echo "$bin"
  exit 0
fi

mkdir -p "$dir"
# One build at a time (two benchmark scripts started together would otherwise both build).
exec 9>"$dir/.lock"
flock 9
if built; then
  echo "$bin"
  exit 0
fi

# Build tools, installed as tools/setup.sh installs its packages.
"$here/apt_install.sh" llamacpp build-essential cmake python3 python3-pip ca-certificates ||
  die "the build tools are missing"
command -v cmake >/dev/null || die "cmake is missing (apt-get install cmake)"
command -v c++ >/dev/null || die "no C++ compiler (apt-get install build-essential)"

# The sdist: llama-cpp-python carries llama.cpp under vendor/llama.cpp.
sdist_dir="$cache/wheels"
mkdir -p "$sdist_dir"
sdist="$sdist_dir/llama_cpp_python-$version.tar.gz"
if [ ! -f "$sdist" ]; then
  echo "llamacpp: downloading the sdist of llama-cpp-python==$version from PyPI into $sdist_dir ..." >&2
  py=$(command -v python3 || true)
  [ -n "$py" ] || die "python3 is needed to download the sdist (apt-get install python3 python3-pip)"
  # The sdist's link and sha256 from PyPI's simple index (curl; seconds). pip download, the
  # fallback, prepares the sdist's metadata from source with --no-binary :all:, which builds
  # its build dependencies from source too (tens of minutes on 2 cores).
  link=$(curl -sSf "https://pypi.org/simple/llama-cpp-python/" 2>/dev/null |
    grep -o "href=\"[^\"]*/llama_cpp_python-$version.tar.gz#sha256=[0-9a-f]*\"" | head -n1 |
    sed 's/^href="//; s/"$//') || true
  if [ -n "$link" ] && curl -sSfLo "$sdist.part" "${link%%#*}" &&
    [ "$(sha256sum "$sdist.part" | cut -d' ' -f1)" = "${link##*sha256=}" ]; then
    mv "$sdist.part" "$sdist"
  fi
  rm -f "$sdist.part"
  if [ ! -f "$sdist" ] && ! "$py" -m pip download --no-binary :all: --no-deps --disable-pip-version-check -q \
    "llama-cpp-python==$version" -d "$sdist_dir" >&2; then
    die "could not download llama-cpp-python==$version from PyPI (offline, or no pip?).
          Copy llama_cpp_python-$version.tar.gz by hand into $sdist_dir and run again."
  fi
  [ -f "$sdist" ] || die "pip did not leave $sdist (got: $(ls "$sdist_dir"))"
fi

src="$dir/src"
if [ ! -f "$src/CMakeLists.txt" ]; then
  echo "llamacpp: unpacking vendor/llama.cpp from $(basename "$sdist") ..." >&2
  rm -rf "$src" "$dir/unpack"
  mkdir -p "$dir/unpack"
  tar -xzf "$sdist" -C "$dir/unpack" "llama_cpp_python-$version/vendor/llama.cpp" ||
    die "$sdist has no vendor/llama.cpp (corrupt download? delete it and run again)"
  mv "$dir/unpack/llama_cpp_python-$version/vendor/llama.cpp" "$src"
  rm -rf "$dir/unpack"
fi

jobs=$(nproc 2>/dev/null || echo 2)
echo "llamacpp: building ${targets[*]} (llama.cpp from llama-cpp-python $version) with -j$jobs ..." >&2
t0=$(date +%s)
# A build tree from another CPU (stamp mismatch) holds objects compiled for it: start anew.
[ -f "$stamp" ] && rm -rf "$dir/build" "$stamp"
cmake -S "$src" -B "$dir/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \
  -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
  -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON >&2 || die "cmake configure failed (see above)"
cmake --build "$dir/build" -j"$jobs" --target "${targets[@]}" >&2 || die "build failed (see above)"
"$bin/llama-bench" --help >/dev/null || die "$bin/llama-bench --help fails"
printf '%s\ncpu %s\n' "$version $(date -u +%FT%TZ) $(($(date +%s) - t0)) s" "$cpu_id" >"$stamp"
echo "llamacpp: built in $(($(date +%s) - t0)) s" >&2
echo "$bin"
