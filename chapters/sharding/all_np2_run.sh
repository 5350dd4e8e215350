#!/bin/sh
# all_np2_run.sh PROGRAM: the whole chapter as 2 processes (what `./d2l chapter5 --np 2` runs), --quick --steps 1,
# with 2 devices a process (4 by default without a GPU): part 1 over the ranks, its hybrid table over
# 2 x 2 devices, then the grid (1 dp x 2 tp). Checks that rank 0 prints every part and that every
# check line says equal: each sharded stage and hybrid layout against the replicated run, the grid
# against the unsharded run; and that the parts run once (one title each), not once per rank.
prog=$1
out=$(mktemp) || exit 99
trap 'rm -f "$out"' EXIT
sh "$(dirname "$0")/../../tests/dist/mpirun.sh" 2 200 "$prog" --quick --num-gpus 2 --steps 1 >"$out" 2>&1
rc=$?
cat "$out"
[ "$rc" -eq 0 ] || { echo "FAIL: exit $rc"; exit 1; }
bad=0
n=$(grep -c '^1\. Memory per rank over 2 processes' "$out"); [ "$n" -eq 1 ] || { echo "FAIL: part 1's title $n times"; bad=1; }
n=$(grep -c '^3\. The grid over processes: 2 processes as 1 dp x 2 tp' "$out"); [ "$n" -eq 1 ] || { echo "FAIL: the grid's title $n times"; bad=1; }
n=$(grep -c '^ZeRO-[0-9] check over 2 processes: .* equal the replicated run' "$out")
stages=$(grep -c '^ *2 *[0-9] 0:' "$out")  # a row for rank 0 per stage run
[ "$n" -ge 2 ] && [ "$n" -eq $((stages - 1)) ] || { echo "FAIL: $n ZeRO check lines say equal, for $stages stages run"; bad=1; }
n=$(grep -c '^1b\. Hybrid sharding over 2 processes x 2 devices' "$out"); [ "$n" -eq 1 ] || { echo "FAIL: the hybrid table's title $n times"; bad=1; }
n=$(grep -c "^hybrid check, ZeRO-[12], shards .* equal.* the replicated run's" "$out"); [ "$n" -eq 6 ] || { echo "FAIL: $n hybrid check lines say equal, expected 6"; bad=1; }
grep -q '^grid check: 1 dp x 2 tp over 2 processes equals the unsharded run' "$out" || { echo "FAIL: no grid check line saying equal"; bad=1; }
grep -q '^2\. Tensor parallelism' "$out" && { echo "FAIL: part 2 (the devices of one process) ran under mpirun"; bad=1; }
[ "$bad" -eq 0 ] && echo "ok: the chapter as 2 processes, part 1 and the grid, every check equal"
exit $bad
