#!/bin/sh
# mismatch.sh PROGRAM: two ranks started with different flags (mpirun's MPMD form: rank 1 has another
# --seed) must both end, non-zero, within 10 s, with a line naming what differs: never a hang.
prog=$1
command -v mpirun >/dev/null 2>&1 || { echo "mpirun not found (install openmpi-bin)" >&2; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,vader
err=$(mktemp)
timeout -k 2 10 mpirun --oversubscribe --bind-to none -np 1 "$prog" kv --quick --out-dir '' : \
  -np 1 "$prog" kv --quick --out-dir '' --seed 1 >/dev/null 2>"$err"
rc=$?
cat "$err" >&2
named=$(grep -c "seed" "$err")
rm -f "$err"
[ "$rc" -ne 0 ] || { echo "FAIL: exit code 0"; exit 1; }
[ "$rc" -ne 124 ] && [ "$rc" -ne 137 ] || { echo "FAIL: still running after 10 s (a hang)"; exit 1; }
[ "$named" -ge 1 ] || { echo "FAIL: no line names the seed"; exit 1; }
echo "ok: exit $rc, the differing seed named"
