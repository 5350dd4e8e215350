#!/bin/sh
# Runs a wall-clock test up to N times and passes on the first run that passes:
#   retry.sh N PROGRAM [ARGS...]
# For suite timing only (overlaps, busbw, peaks that depend on when threads run): on a machine that
# another job loads, one slow run is not a failure of the code, three in a row are. Every failed
# run's output stays in the log.
n=$1; shift
i=1
while :; do
  "$@" && exit 0
  rc=$?
  [ "$i" -ge "$n" ] && { echo "failed $n runs of $1 (last exit $rc)" >&2; exit "$rc"; }
  echo "run $i of $n failed (exit $rc); again" >&2
  i=$((i + 1))
done
