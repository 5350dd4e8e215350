#!/bin/sh
# mixed_run.sh MPIRUN_SH PROGRAM: part 3 (the grid) with --quick --precision fp16 as 4 processes (2 dp
# x 2 tp), where the one-process reference run trains alone on rank 0 beside a world of four: it
# must end (exit 0, no hang: the loss scaler agrees on skipped steps over the Trainer's groups only),
# report the comparison with the unsharded run without checking it (the runs round and skip steps
# differently), and every rank's optimizer state must still be its model's bytes.
mpirun_sh=$1
prog=$2
out=$(mktemp) || exit 99
trap 'rm -f "$out"' EXIT
sh "$mpirun_sh" 4 200 "$prog" grid --quick --tp-size 2 --precision fp16 >"$out" 2>&1
rc=$?
cat "$out"
[ "$rc" -eq 0 ] || { echo "FAIL: exit $rc"; exit 1; }
grep -q "under autocast: reported, not checked" "$out" || { echo "FAIL: no grid check line under autocast"; exit 1; }
[ "$(grep -c '^  rank [0-9]*: [0-9]* bytes (model' "$out")" -eq 4 ] || { echo "FAIL: not one state line per rank"; exit 1; }
if grep -q "DIFFER" "$out"; then echo "FAIL: a line marked DIFFER"; exit 1; fi
echo "OK: the grid in float16 over 4 processes"
