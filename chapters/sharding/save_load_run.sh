#!/bin/sh
# save_load_run.sh PROGRAM: part 1's sharded checkpoints (--save, --load) passed from one layout to
# another (memory --quick --steps 3, 4 steps a run):
#   A  2 processes of 1 device, ZeRO-2 --save A: index.json, parameters.safetensors and one file per
#      rank, each rank's holding its chunk of Adam's state only: at least 8 Psi_r bytes (Psi_r =
#      floor(Psi (r+1) / 2) - floor(Psi r / 2), from the printed Psi) and less than 16 KiB more; the
#      sizes printed equal the sizes on disk; the index's step is 4;
#   B  one process of 2 devices, up to ZeRO-3, --load A --save B: A resharded into every run's layout
#      (devices, stage 3's units); B's step is 8, so the loaded state's step count went on; one file
#      holding all of the state (8 Psi bytes and more);
#   C  2 processes of 2 devices, ZeRO-2 and the hybrid table, --load B --save C: C's step is 12.
# Every run exits 0 with every check line equal (the program's exit code says so).
prog=$1
dir=$(mktemp -d) || exit 99
out=$dir/out
trap 'rm -rf "$dir"' EXIT
mpirun_sh="$(dirname "$0")/../../tests/dist/mpirun.sh"
step_of() { sed -n 's/.*"step": *\([0-9]*\).*/\1/p' "$1/index.json" | head -1; }
run() {  # NAME COMMAND...: the run, its output kept in $out
  name=$1
  shift
  "$@" >"$out" 2>&1
  rc=$?
  cat "$out"
  [ "$rc" -eq 0 ] || { echo "FAIL: run $name: exit $rc"; exit 1; }
}
run A sh "$mpirun_sh" 2 200 "$prog" memory --quick --num-gpus 1 --zero-stage 2 --steps 3 --save "$dir/A"
psi=$(sed -n 's/.*Psi = \([0-9]*\) trainable.*/\1/p' "$out" | head -1)
[ -n "$psi" ] || { echo "FAIL: no Psi printed"; exit 1; }
bad=0
for f in index.json parameters.safetensors rank-0-of-2.safetensors rank-1-of-2.safetensors; do
  [ -s "$dir/A/$f" ] || { echo "FAIL: A has no $f"; bad=1; continue; }
  size=$(stat -c %s "$dir/A/$f")
  grep -q "^saved: .* $f $size B" "$out" || { echo "FAIL: the saved line does not give $f's $size bytes"; bad=1; }
done
for r in 0 1; do
  chunk=$((psi * (r + 1) / 2 - psi * r / 2))
  size=$(stat -c %s "$dir/A/rank-$r-of-2.safetensors")
  [ "$size" -ge $((8 * chunk)) ] && [ "$size" -lt $((8 * chunk + 16384)) ] ||
    { echo "FAIL: rank $r's file has $size bytes, expected its chunk's state, 8 x $chunk and a header"; bad=1; }
done
[ "$(step_of "$dir/A")" = 4 ] || { echo "FAIL: A's step is $(step_of "$dir/A"), expected 4"; bad=1; }
run B "$prog" memory --quick --num-gpus 2 --steps 3 --load "$dir/A" --save "$dir/B"
grep -q "^--load: every run of part 1 starts from the sharded checkpoint in $dir/A" "$out" || { echo "FAIL: no --load line"; bad=1; }
[ "$(step_of "$dir/B")" = 8 ] || { echo "FAIL: B's step is $(step_of "$dir/B"), expected 8 (A's 4 and 4 more)"; bad=1; }
[ "$(stat -c %s "$dir/B/rank-0-of-1.safetensors")" -ge $((8 * psi)) ] || { echo "FAIL: B's one rank file holds less than the whole state"; bad=1; }
run C sh "$mpirun_sh" 2 200 "$prog" memory --quick --num-gpus 2 --zero-stage 2 --steps 3 --load "$dir/B" --save "$dir/C"
[ "$(grep -c '^hybrid check, .* equal' "$out")" -eq 6 ] || { echo "FAIL: the hybrid runs did not all load and match"; bad=1; }
[ "$(step_of "$dir/C")" = 12 ] || { echo "FAIL: C's step is $(step_of "$dir/C"), expected 12"; bad=1; }
[ "$bad" -eq 0 ] || exit 1
echo "ok: saved at 2 ranks (each rank its chunk), loaded and saved again on 2 devices up to ZeRO-3, loaded at 2 ranks x 2 devices: steps 4, 8, 12"
