#!/usr/bin/env bash
# Installs the Debian packages given that are missing (apt-get, with sudo when not root).
# Usage: tools/apt_install.sh TAG PKG...   (TAG prefixes the messages, e.g. "setup")
# Used by tools/setup.sh and tools/llamacpp.sh; exits non-zero with a clear message when
# the install fails.
set -euo pipefail
tag=$1
shift
missing=()
for p in "$@"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "$tag: installing ${missing[*]}" >&2
sudo_cmd=""
[ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
if ! { $sudo_cmd apt-get update -qq >&2 &&
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "${missing[@]}" >&2; }; then
  echo "$tag: could not install ${missing[*]}; install them by hand: apt-get install ${missing[*]}" >&2
  exit 1
fi
