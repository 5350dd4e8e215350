#!/bin/sh
# interrupt_resume.sh PROGRAM ARGS...: trains with --checkpoint ck.safetensors in an empty directory,
# sends SIGINT once the first epoch's checkpoint exists (training of the next epoch under way), and
# checks that the program exits 130, leaves the checkpoint and nothing else (no temporary file), and
# that --resume continues from it: "resumed from ck.safetensors after epoch K", then epoch K+1.
. "$(dirname "$0")/lib.sh"
in_empty_dir "$1"
shift
"$prog" "$@" --num-epochs 1000 --checkpoint ck.safetensors >"$work/out" 2>"$work/err" &
pid=$!
wait_for_checkpoint $pid
kill -INT $pid
wait $pid
rc=$?
left=$(ls -A)
echo "SIGINT after the first checkpoint: exit $rc; files: $left; $(grep -c '^epoch [0-9]*,' "$work/out") epoch(s) done"
[ "$rc" -eq 130 ] || { echo "FAIL: exit $rc, expected 130"; exit 1; }
[ "$left" = "ck.safetensors" ] || { echo "FAIL: files left: $left (expected the checkpoint alone)"; exit 1; }
k=$(grep -c '^epoch [0-9]*,' "$work/out")
"$prog" "$@" --num-epochs $((k + 1)) --resume ck.safetensors >"$work/out2" 2>"$work/err2"
rc=$?
cat "$work/out2" | grep -E '^(resumed|epoch [0-9]+,)'
[ "$rc" -eq 0 ] || { echo "FAIL: --resume exit $rc: $(tail -n 1 "$work/err2")"; exit 1; }
grep -q "^resumed from ck.safetensors after epoch $k" "$work/out2" || { echo "FAIL: did not resume after epoch $k"; exit 1; }
grep -q "^epoch $((k + 1))," "$work/out2" || { echo "FAIL: epoch $((k + 1)) did not run"; exit 1; }
grep -q "^epoch $k," "$work/out2" && { echo "FAIL: epoch $k ran again"; exit 1; }
exit 0
