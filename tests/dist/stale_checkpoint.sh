#!/bin/sh
# Two ranks resume from checkpoints of different epochs (each rank its own --resume file, as ranks
# with their own working directories have): every rank must end, non-zero, within 10 s, with a line
# naming rank 1 and the checkpoint's epoch; never rank 0 finishing while rank 1 waits.
#   stale_checkpoint.sh PROGRAM (chapter 2's multi_gpu_concise)
prog=$1
command -v mpirun >/dev/null 2>&1 || { echo "mpirun not found (install openmpi-bin)" >&2; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,vader
dir=$(mktemp -d) || exit 99
trap 'rm -rf "$dir"' EXIT
common="--quick --model lab-cnn --num-gpus 1 --plot '' --train-subset 256 --test-subset 64"
for e in 1 2; do
  eval "\"$prog\" $common --num-epochs $e --checkpoint \"$dir/after$e.ckpt\"" >/dev/null || { echo "FAIL: writing the checkpoint of epoch $e"; exit 1; }
done
start=$(date +%s)
eval "timeout -k 2 10 mpirun --oversubscribe --bind-to none \
  -np 1 \"$prog\" --kvstore dist_sync $common --num-epochs 3 --resume \"$dir/after2.ckpt\" : \
  -np 1 \"$prog\" --kvstore dist_sync $common --num-epochs 3 --resume \"$dir/after1.ckpt\"" >/dev/null 2>"$dir/err"
rc=$?
took=$(( $(date +%s) - start ))
cat "$dir/err" >&2
[ "$rc" -ne 0 ] || { echo "FAIL: exit code 0"; exit 1; }
[ "$rc" -ne 124 ] && [ "$rc" -ne 137 ] || { echo "FAIL: still running after 10 s (a hang)"; exit 1; }
grep -q "rank 1 has checkpoint epoch 1, rank 0 has 2" "$dir/err" || { echo "FAIL: no line names rank 1's checkpoint epoch"; exit 1; }
echo "ok: exit $rc after ${took} s, rank 1's stale checkpoint named"
