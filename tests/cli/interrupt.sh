#!/bin/sh
# interrupt.sh SIGNAL CODE SECONDS PROGRAM ARGS...: starts a training run in an empty directory,
# sends SIGNAL once it has printed its first line on stdout (training is under way), and checks
# that it exits with CODE within SECONDS and leaves no file behind (outputs are written only at the
# end, through temporary files). ARGS should name outputs in the working directory.
# With AFTER set (a grep pattern), the signal waits for a stdout line that matches it instead
# (AFTER=evaluating: during the evaluation of a saved net), and SETTLE seconds more (default 0.5).
# Fresh heap memory is filled with 0xdc bytes (glibc's MALLOC_PERTURB_=35 fills with 35 ^ 0xff;
# fixed here rather than meson's random byte, some of which make floats near 0 that pass
# unnoticed): a value read from work that was skipped after the signal is then -5e17, not 0.
export MALLOC_PERTURB_=35
sig=$1
code=$2
limit=$3
shift 3
. "$(dirname "$0")/lib.sh"
in_empty_dir "$1"
shift
"$prog" "$@" >"$work/out" 2>"$work/err" &
pid=$!
i=0
until [ -s "$work/out" ] && grep -q -- "${AFTER:-.}" "$work/out"; do  # the first line (or the one AFTER names)
  sleep 0.1
  kill -0 $pid 2>/dev/null || { echo "FAIL: exited before the signal: $(cat "$work/err")"; exit 1; }
  i=$((i + 1))
  if [ $i -ge 600 ]; then echo "FAIL: no output after 60 s"; kill -KILL $pid; exit 1; fi
done
sleep "${SETTLE:-0.5}"
kill -0 $pid 2>/dev/null || { echo "FAIL: the run ended before the signal (nothing to interrupt)"; exit 1; }
t0=$(date +%s.%N)
kill -"$sig" $pid
wait $pid
rc=$?
t1=$(date +%s.%N)
took=$(echo "$t1 - $t0" | bc)
left=$(ls -A)
echo "SIG$sig: exit $rc after $took s; stderr: $(tail -n 1 "$work/err" | tr '\r' ' ')"
failed=0
[ "$rc" -eq "$code" ] || { echo "FAIL: exit $rc, expected $code"; failed=1; }
[ "$(echo "$took < $limit" | bc)" -eq 1 ] || { echo "FAIL: took $took s, limit $limit s"; failed=1; }
[ -z "$left" ] || { echo "FAIL: files left: $left"; failed=1; }
exit $failed
