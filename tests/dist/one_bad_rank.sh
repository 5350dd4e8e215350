#!/bin/sh
# One rank of two is given a data directory that does not exist (mpirun's MPMD form: rank 0 runs on
# generated data, rank 1 on /nonexistent). Every rank must end, non-zero, within 10 s (rank 0 is
# then waiting in the configuration exchange), and a line of stderr must name rank 1 and the cause.
#   one_bad_rank.sh PROGRAM
prog=$1
command -v mpirun >/dev/null 2>&1 || { echo "mpirun not found (install openmpi-bin)" >&2; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,vader
err=$(mktemp)
start=$(date +%s)
timeout -k 2 10 mpirun --oversubscribe --bind-to none \
  -np 1 "$prog" --kvstore dist_sync --model lab-cnn --quick --plot '' : \
  -np 1 "$prog" --kvstore dist_sync --model lab-cnn --data-dir /nonexistent/fashion --plot '' >/dev/null 2>"$err"
rc=$?
took=$(( $(date +%s) - start ))
cat "$err" >&2
line=$(grep -c '^error: rank 1: .*/nonexistent/fashion' "$err")
rm -f "$err"
[ "$rc" -ne 0 ] || { echo "FAIL: exit code 0" >&2; exit 1; }
[ "$rc" -ne 124 ] && [ "$rc" -ne 137 ] || { echo "FAIL: still running after 10 s (a hang)" >&2; exit 1; }
[ "$line" -eq 1 ] || { echo "FAIL: no line 'error: rank 1: ... /nonexistent/fashion' on stderr" >&2; exit 1; }
echo "ok: exit $rc after ${took} s, rank 1 named"
