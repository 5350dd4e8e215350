#!/bin/sh
# quick_run.sh MPIRUN_SH PROGRAM: chapter 4 end to end under mpirun -np 2 with --quick: it exits 0,
# prints the four parts, writes bandwidth.png and ddp_step_time.png (when gnuplot is there) and one
# trace whose events carry both ranks (pid 0 and 1) and bucket allreduces.
mpirun_sh=$1
prog=$2
dir=$(mktemp -d) || exit 99
trap 'rm -rf "$dir"' EXIT
sh "$mpirun_sh" 2 250 "$prog" --quick --out-dir "$dir" --trace "$dir/trace.json" >"$dir/out" 2>"$dir/err"
rc=$?
cat "$dir/out"
cat "$dir/err" >&2
[ "$rc" -eq 0 ] || { echo "FAIL: exit $rc"; exit 1; }
for part in "1. Ring synchronization" "2. DDP on ResNet-18" "MODELLED link" "3. Equivalence" "4. The key-value store" "latency-bound below"; do
  grep -q "$part" "$dir/out" || { echo "FAIL: no '$part' in the output"; exit 1; }
done
if command -v gnuplot >/dev/null 2>&1; then
  for png in bandwidth.png ddp_step_time.png; do
    [ -s "$dir/$png" ] || { echo "FAIL: no $png"; exit 1; }
  done
fi
for pid in 0 1; do
  grep -q "\"pid\": $pid, \"tid\"" "$dir/trace.json" || { echo "FAIL: the trace has no events of rank $pid"; exit 1; }
done
grep -q '"name": "bucket 0' "$dir/trace.json" || { echo "FAIL: no bucket allreduce in the trace"; exit 1; }
echo "ok: four parts printed, plots and a two-rank trace written"
