# Shared by the grid scripts (tools/eval/run_*.sh, results/eval/*/run.sh): sourced, not run.
# It spells the task lists and the default once, and runs a grid in rounds of samples, so every
# task has k samples before any has k + 1; a rerun of the same command resumes (qevict eval
# skips the cells already in its --out folder).
#
#   source tools/eval/grid_common.sh      # from the repository root
#   grid_rounds MAX_SAMPLES eval-arguments...   # without -m, -t and --samples

# The 13 RULER tasks (qa_1/qa_2 need tools/fetch_ruler_data.sh) and the 11 without qa, as the
# tuning grids of 4K/8K/16K ran them.
RULER11=niah_single_1,niah_single_2,niah_single_3,niah_multikey_1,niah_multikey_2,niah_multikey_3
RULER11+=,niah_multivalue,niah_multiquery,vt,cwe,fwe
RULER13=$RULER11,qa_1,qa_2
# qevict's default written out (a grid column keeps its name when the default moves), the same
# with INT2 keys and values, and the paper's configuration (Eq. 1 over every prompt query, INT2,
# no pooling).
QEVICT_DEFAULT=qevict:route=end:prefill_window=32:pool=2:bits=4:vbits=2
QEVICT_INT2=qevict:route=end:prefill_window=32:pool=2:bits=2:vbits=2
QEVICT_PAPER=qevict:route=end:prefill_window=0:bits=2

# The binary: QEVICT_BIN, a copy so that rebuilding the tree never changes a grid's code mid-run
# (record its commit: PATH --version); else the tree's build.
GRID_BIN=${QEVICT_BIN:-build/tools/qevict}
GRID_MODEL=${GRID_MODEL:-$(tools/fetch_model.sh qwen2.5-coder-0.5b | tail -n1)}
bash tools/fetch_ruler_data.sh >/dev/null  # qa_1/qa_2 and the essay haystack

# grid_rounds MAX ARGS...: `qevict eval --samples s ARGS` for s = 1..MAX, niced, on 2 threads.
# While /work/measure/QUIET exists (the lead is timing) the eval is stopped (SIGSTOP, this one
# process) and continued when it goes. Returns non-zero when an eval fails.
grid_rounds() {
  local max=$1 s pid
  shift
  # nice alone does not yield to other sessions when the kernel groups tasks by session
  # (sched_autogroup, Debian's default): a grid started with setsid took a whole core from a
  # CI run beside it. When this script leads its own session (started with setsid), the
  # session's group gets the lowest weight too; a terminal's session is left alone.
  if [ "$(ps -o sid= -p $$ | tr -d ' ')" = "$$" ]; then
    echo 19 2>/dev/null >/proc/self/autogroup || true
  fi
  for s in $(seq 1 "$max"); do
    while [ -e /work/measure/QUIET ]; do sleep 20; done
    nice -n 19 "$GRID_BIN" eval -t 2 -m "$GRID_MODEL" --samples "$s" "$@" &
    pid=$!
    while kill -0 "$pid" 2>/dev/null; do
      if [ -e /work/measure/QUIET ]; then
        kill -STOP "$pid" 2>/dev/null
        while [ -e /work/measure/QUIET ]; do sleep 2; done
        kill -CONT "$pid" 2>/dev/null
      fi
      sleep 1
    done
    wait "$pid" || return 1
  done
}
