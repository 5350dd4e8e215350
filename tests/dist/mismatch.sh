#!/bin/sh
# Two ranks started with flags that differ (mpirun's MPMD form): every rank must end, non-zero, within
# 10 s, with a line naming WORD (the setting that differs): never a hang, never a crash.
#   mismatch.sh WORD PROGRAM ARGS... -- RANK1_ARGS...   (rank 0 runs ARGS, rank 1 ARGS and RANK1_ARGS)
word=$1
prog=$2
shift 2
common=""
while [ $# -gt 0 ] && [ "$1" != "--" ]; do common="$common '$1'"; shift; done
[ $# -gt 0 ] && shift
extra=""
for a in "$@"; do extra="$extra '$a'"; done
command -v mpirun >/dev/null 2>&1 || { echo "mpirun not found (install openmpi-bin)" >&2; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,vader
err=$(mktemp)
eval "timeout -k 2 10 mpirun --oversubscribe --bind-to none -np 1 \"$prog\" $common : -np 1 \"$prog\" $common $extra" >/dev/null 2>"$err"
rc=$?
cat "$err" >&2
named=$(grep -c -- "differ.*$word" "$err")
crashed=$(grep -c -i -e "segmentation fault" -e "malloc()" -e "free()" -e "core dumped" -e "signal 6" -e "signal 11" "$err")
rm -f "$err"
[ "$rc" -ne 0 ] || { echo "FAIL: exit code 0"; exit 1; }
[ "$rc" -ne 124 ] && [ "$rc" -ne 137 ] || { echo "FAIL: still running after 10 s (a hang)"; exit 1; }
[ "$crashed" -eq 0 ] || { echo "FAIL: a rank crashed"; exit 1; }
[ "$named" -ge 1 ] || { echo "FAIL: no line says the ranks differ in $word"; exit 1; }
echo "ok: exit $rc, the differing $word named"
