#!/bin/sh
# Ctrl-C to a run of several processes: starts PROGRAM ARGS as 2 ranks under mpirun, sends SIGNAL
# to mpirun once rank 0 has printed its first line (training is under way), and checks that mpirun
# has exited non-zero and every rank is gone within 10 s.
#   interrupt_all.sh SIGNAL PROGRAM ARGS...
sig=$1
shift
command -v mpirun >/dev/null 2>&1 || { echo "mpirun not found (install openmpi-bin)" >&2; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,vader
work=$(mktemp -d) || exit 99
trap 'rm -rf "$work"' EXIT
prog=$1
shift
name=$(basename "$prog" | cut -c1-15)  # the process name pgrep sees (15 characters at most)
mpirun --oversubscribe --bind-to none -np 2 "$prog" "$@" >"$work/out" 2>"$work/err" &
pid=$!
i=0
until [ -s "$work/out" ]; do
  sleep 0.1
  kill -0 $pid 2>/dev/null || { echo "FAIL: exited before the signal: $(cat "$work/err")"; exit 1; }
  i=$((i + 1))
  if [ $i -ge 600 ]; then echo "FAIL: no output after 60 s"; kill -KILL $pid; exit 1; fi
done
sleep 0.5
t0=$(date +%s)
kill -"$sig" $pid
i=0
while kill -0 $pid 2>/dev/null; do
  sleep 0.1
  i=$((i + 1))
  if [ $i -ge 100 ]; then echo "FAIL: mpirun still running 10 s after SIG$sig"; kill -KILL $pid; pkill -KILL -x "$name"; exit 1; fi
done
wait $pid
rc=$?
while pgrep -x "$name" >/dev/null; do  # the ranks end by themselves, within the same 10 s
  sleep 0.1
  i=$((i + 1))
  if [ $i -ge 100 ]; then echo "FAIL: a rank still running 10 s after SIG$sig"; pkill -KILL -x "$name"; exit 1; fi
done
echo "SIG$sig: mpirun exited $rc after $(( $(date +%s) - t0 )) s; stderr: $(grep -a 'error\|stopped' "$work/err" | head -2 | tr '\n' ' ')"
[ "$rc" -ne 0 ] || { echo "FAIL: exit code 0"; exit 1; }
