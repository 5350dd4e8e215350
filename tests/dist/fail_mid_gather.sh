#!/bin/sh
# A rank that fails in the middle of ZeRO's all-gather takes every rank down: runs PROGRAM ARGS as
# NP ranks under mpirun with D2L_FAIL_RANK_IN_ALLGATHER=1 (core/optim/zero.hpp: rank 1 throws
# in the all-gather of its second sharded step, while the other ranks wait inside the collective),
# or with the value given in the environment (1:3: in ZeRO-3's first all-gather of its second step,
# core/optim/zero.hpp).
# Every rank must end within D2L_HANG_LIMIT seconds of the start (20; meson gives 60 under a sanitizer:
# under TSan the ZeRO-3 run reaches its failure after 18 s, about 2 s in the plain build), the exit
# code non-zero, with exactly one stderr line
# "error: rank 1: ..." naming the all-gather; never a hang, never a crash.
#   fail_mid_gather.sh NP PROGRAM ARGS...
np=$1
prog=$2
shift 2
command -v mpirun >/dev/null 2>&1 || { echo "mpirun not found (install openmpi-bin)" >&2; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,vader
# Each aborting rank's "MPI_ABORT was invoked" notice is printed where it is raised, not forwarded to
# mpirun to be merged with the others: Open MPI 4.1's launcher can crash in that forwarding while it
# tears the job down (a segmentation fault in its own log handler, pmix_server_log_fn, seen with
# 4 ranks and freed memory perturbed by meson's MALLOC_PERTURB_), which this test would report as a
# crash although every rank of ours ended as it should.
export OMPI_MCA_orte_base_help_aggregate=0
unset MALLOC_PERTURB_
export D2L_FAIL_RANK_IN_ALLGATHER="${D2L_FAIL_RANK_IN_ALLGATHER:-1}"  # 1:3 for ZeRO-3's all-gather only
err=$(mktemp)
name=$(basename "$prog" | cut -c1-15)  # the process name pgrep sees (15 characters at most)
exe=$(readlink -f "$prog")
# Whether a process of this very program is still running (other builds' programs of the same name are not ours).
ours_running() {
  for p in $(pgrep -x "$name"); do [ "$(readlink -f "/proc/$p/exe" 2>/dev/null)" = "$exe" ] && return 0; done
  return 1
}
start=$(date +%s)
limit="${D2L_HANG_LIMIT:-20}"
timeout -k 2 "$limit" mpirun --oversubscribe --bind-to none -x D2L_FAIL_RANK_IN_ALLGATHER -np "$np" "$prog" "$@" >/dev/null 2>"$err"
rc=$?
i=0
while ours_running; do  # no rank left behind
  sleep 0.1
  i=$((i + 1))
  [ $i -lt 30 ] || { echo "FAIL: a rank still running after mpirun exited"; rm -f "$err"; exit 1; }
done
took=$(( $(date +%s) - start ))
cat "$err" >&2
line=$(grep -c '^error: rank 1: .*all-gather' "$err")
others=$(grep -c '^error: rank [02-9]' "$err")
crashed=$(grep -c -i -e "segmentation fault" -e "malloc()" -e "free()" -e "core dumped" -e "signal 6" -e "signal 11" -e "terminate called" "$err")
rm -f "$err"
[ "$rc" -ne 0 ] || { echo "FAIL: exit code 0"; exit 1; }
[ "$rc" -ne 124 ] && [ "$rc" -ne 137 ] || { echo "FAIL: still running after $limit s (a hang)"; exit 1; }
[ "$crashed" -eq 0 ] || { echo "FAIL: a rank crashed"; exit 1; }
[ "$line" -eq 1 ] || { echo "FAIL: $line lines 'error: rank 1: ... all-gather ...' on stderr, expected 1"; exit 1; }
[ "$others" -eq 0 ] || { echo "FAIL: another rank reported an error of its own"; exit 1; }
echo "ok: $np ranks, exit $rc after ${took} s, rank 1's failure in the all-gather named once"
