#!/bin/sh
# kill_checkpoint.sh PROGRAM ARGS...: a writer killed with SIGKILL while it writes a checkpoint.
# Trains with --checkpoint ck.safetensors in an empty directory; once the first epoch's checkpoint
# exists, waits for the next one's temporary file (.ck.safetensors.tmp.HOST.PID.N) and kills the
# program at once (kill -9: no handler runs). Then checks:
#   - the killed writer left its temporary file and ck.safetensors is the previous, whole checkpoint;
#   - a second run with --resume ck.safetensors --checkpoint ck.safetensors continues from it
#     ("resumed from ck.safetensors after epoch K") and removes the stale temporary file: the
#     directory holds ck.safetensors alone.
# A write can finish between the poll and the kill; then the kill is tried again (3 times at most).
. "$(dirname "$0")/lib.sh"
in_empty_dir "$1"
shift
caught=""
for attempt in 1 2 3; do
  rm -f ck.safetensors .ck.safetensors.tmp.*
  "$prog" "$@" --num-epochs 1000 --checkpoint ck.safetensors >"$work/out" 2>"$work/err" &
  pid=$!
  wait_for_checkpoint $pid
  cp ck.safetensors "$work/previous"
  i=0
  until ls -A | grep -q '^\.ck\.safetensors\.tmp\.'; do
    i=$((i + 1))
    if [ $i -ge 20000 ]; then echo "FAIL: no second checkpoint write seen"; kill -KILL $pid; exit 1; fi
  done
  kill -KILL $pid
  wait $pid 2>/dev/null
  caught=$(ls -A | grep '^\.ck\.safetensors\.tmp\.')
  if [ -n "$caught" ] && cmp -s ck.safetensors "$work/previous"; then break; fi
  echo "attempt $attempt: the write finished before the kill; again"
  caught=""
done
[ -n "$caught" ] || { echo "FAIL: no write interrupted in 3 attempts"; exit 1; }
k=$(head -c 65536 ck.safetensors | grep -ao '"epoch":"[0-9]*"' | tr -dc 0-9)  # the epoch in its __metadata__
[ -n "$k" ] || { echo "FAIL: ck.safetensors has no epoch"; exit 1; }
echo "killed (SIGKILL) while writing epoch $((k + 1))'s checkpoint: left $caught ($(wc -c <"$caught") bytes); ck.safetensors is epoch $k's"
case "$caught" in *".$pid."*) ;; *) echo "FAIL: the temporary file's name does not carry the writer's pid $pid"; exit 1 ;; esac
"$prog" "$@" --num-epochs $((k + 1)) --resume ck.safetensors --checkpoint ck.safetensors >"$work/out2" 2>"$work/err2"
rc=$?
grep -E '^(resumed|epoch [0-9]+,)' "$work/out2"
[ "$rc" -eq 0 ] || { echo "FAIL: --resume exit $rc: $(tail -n 1 "$work/err2")"; exit 1; }
grep -q "^resumed from ck.safetensors after epoch $k" "$work/out2" || { echo "FAIL: did not resume after epoch $k"; exit 1; }
left=$(ls -A)
[ "$left" = "ck.safetensors" ] || { echo "FAIL: files left after the second run: $left"; exit 1; }
echo "the second run resumed, wrote epoch $((k + 1)) and removed the stale temporary file"
exit 0
