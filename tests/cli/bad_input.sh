#!/bin/sh
# bad_input.sh PROGRAM TABLE [EDIT]: runs PROGRAM once per line of TABLE, "CODE|WORD|ARGS" (ARGS split
# as by the shell), and checks each bad input: the exit code is CODE, stderr is one line that contains
# WORD (the flag or input it names), and no file in the working directory was created or changed
# (keep.png stands for an earlier output that must survive). $DATA in ARGS is a directory of
# prepared data sets: $DATA/empty holds IDX files with no examples, $DATA/file is a plain file.
# ARGS may start with one environment variable for the run (D2L_NUM_THREADS=0 --quick).
# A CODE written "2@nogpu" marks an input that is bad only on a machine without a GPU (--devices
# gpu:0): where a GPU exists (/dev/nvidia0 ...) the line is reported as skipped.
# A line "@COMMAND" prepares inputs: COMMAND runs in $DATA with $PROG (the program) and $EDIT
# (tests/tools/safetensors_edit, the optional third argument) set, and must succeed.
prog=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
table=$(cd "$(dirname "$2")" && pwd)/$(basename "$2")
edit=""
[ -n "${3:-}" ] && edit=$(cd "$(dirname "$3")" && pwd)/$(basename "$3")
work=$(mktemp -d) || exit 99
trap 'chmod -R u+w "$work"; rm -rf "$work"' EXIT
mkdir "$work/run" "$work/io" "$work/data" "$work/data/empty" "$work/run/adir"
DATA=$work/data
: >"$DATA/file"
# IDX headers with zero examples: images (magic 0x803, dims 0x28x28), labels (magic 0x801, dim 0).
for p in train t10k; do
  printf '\000\000\010\003\000\000\000\000\000\000\000\034\000\000\000\034' >"$DATA/empty/$p-images-idx3-ubyte"
  printf '\000\000\010\001\000\000\000\000' >"$DATA/empty/$p-labels-idx1-ubyte"
done
cd "$work/run" || exit 99
echo "an earlier plot" >keep.png
snapshot() { ls -la --time-style=full-iso . | grep -v -e ' \.$' -e ' \.\.$'; cksum keep.png; }  # files, not the directory's own time
before=$(snapshot)
failed=0
skipped=0
n=0
while IFS= read -r line; do
  case "$line" in
  '' | \#*) continue ;;
  @*)
    if ! (cd "$DATA" && PROG=$prog EDIT=$edit DATA=$DATA sh -c "${line#@}" >"$work/io/prep" 2>&1); then
      echo "FAIL preparing: ${line#@}"
      sed 's/^/  /' "$work/io/prep" | tail -5
      failed=$((failed + 1))
    fi
    continue
    ;;
  esac
  code=${line%%|*}
  rest=${line#*|}
  word=${rest%%|*}
  args=${rest#*|}
  case "$code" in
  *@nogpu)
    code=${code%@nogpu}
    if ls /dev/nvidia[0-9]* >/dev/null 2>&1; then
      echo "skip $args: bad only without a GPU, and this machine has one"
      skipped=$((skipped + 1))
      continue
    fi
    ;;
  esac
  n=$((n + 1))
  eval "set -- $args"
  eval "word=\"$word\""
  envset=D2L_BAD_INPUT_TEST=1
  case "${1:-}" in D2L_*=*) envset=$1 && shift ;; esac  # ARGS may start with one D2L_ variable
  timeout 120 env "$envset" "$prog" "$@" >"$work/io/out" 2>"$work/io/err"
  rc=$?
  lines=$(wc -l <"$work/io/err")
  why=""
  [ "$rc" -eq "$code" ] || why="exit $rc, expected $code"
  [ "$lines" -eq 1 ] || why="$why; $lines lines on stderr, expected 1"
  grep -qF -- "$word" "$work/io/err" || why="$why; stderr does not name '$word'"
  [ "$(snapshot)" = "$before" ] || why="$why; files in the working directory changed"
  if [ -n "$why" ]; then
    echo "FAIL $args: $why"
    sed 's/^/  stderr: /' "$work/io/err" | head -5
    failed=$((failed + 1))
    rm -f -- $(ls | grep -v -e '^keep.png$' -e '^adir$')
    echo "an earlier plot" >keep.png
    before=$(snapshot)
  else
    echo "ok   $args -> $rc: $(cat "$work/io/err")"
  fi
done <"$table"
echo "$n bad inputs, $failed failed, $skipped skipped (a GPU is present)"
[ "$n" -gt 0 ] && [ "$failed" -eq 0 ]
