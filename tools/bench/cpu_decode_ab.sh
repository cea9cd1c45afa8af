#!/usr/bin/env bash
# CPU seconds of decode steps, for A/B comparisons on a machine whose wall-clock timings
# drift (a VM with steal time): for each binary and KV policy, runs `qevict bench` with
# -n 1 and with -n N+1 at the same depth and prints CPU(user+sys) of both; the difference is
# the CPU of N decode steps (stolen time is not charged to the process; the thread pool's
# spinning is, so this too follows other load, less than wall time does).
#   tools/bench/cpu_decode_ab.sh OLD_QEVICT NEW_QEVICT [DEPTH=4096] [N=256]
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
[ $# -ge 2 ] || { echo "usage: $0 OLD_QEVICT NEW_QEVICT [DEPTH] [N]" >&2; exit 2; }
old=$1 new=$2 depth=${3:-4096} n=${4:-256}
model=$("$root/tools/fetch_model.sh" | tail -n1)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cpu() {  # binary policy-args... -> CPU seconds of one bench run with -n $N
  local b=$1 steps=$2; shift 2
  /usr/bin/time -f "%U %S" -o "$tmp/t" "$b" bench -m "$model" -d "$depth" -n "$steps" -r 1 -t 2 "$@" \
    > "$tmp/o" 2>&1
  awk '{printf "%.2f", $1 + $2}' "$tmp/t"
}
echo "| binary | policy | CPU s (-n 1) | CPU s (-n $((n + 1))) | CPU s of $n decode steps |"
echo "|---|---|---|---|---|"
for b in "$old" "$new"; do
  for pol in "full" "qevict --kv-budget 0.2"; do
    # shellcheck disable=SC2086
    a=$(cpu "$b" 1 --kv-policy $pol)
    # shellcheck disable=SC2086
    z=$(cpu "$b" $((n + 1)) --kv-policy $pol)
    echo "| $b | $pol | $a | $z | $(awk -v a="$a" -v z="$z" 'BEGIN{printf "%.1f", z - a}') |"
  done
done
