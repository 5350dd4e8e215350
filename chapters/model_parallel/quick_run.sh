#!/bin/sh
# quick_run.sh PROGRAM OUT_DIR: chapter 3 end to end with --quick on 2 CPU devices, plots into OUT_DIR
# and a timeline beside them. It must exit 0, and the "best split size" it prints must be the fastest
# row of the split-size table it printed above it (read here from the printed text alone).
prog=$1
out=$2
log=$(mktemp) || exit 99
trap 'rm -f "$log"' EXIT
"$prog" --quick --num-gpus 2 --out-dir "$out" --trace "$out/model_parallel_trace.json" >"$log"
rc=$?
cat "$log"
[ "$rc" -eq 0 ] || { echo "FAIL: exit $rc"; exit 1; }
# "split size 2:   0.123 s +- ..." rows, then "best split size: 2 (0.123 s)".
awk '
  /^split size [0-9]+( \(no pipelining\))?: / && !/skipped/ { n = $3; sub(":", "", n); t = $0; sub(/^[^:]*: */, "", t); t += 0
                                               if (rows == 0 || t < best_t) { best = n; best_t = t }; rows++ }
  /^best split size: / { said = $4 }
  END {
    if (rows < 2) { print "FAIL: fewer than 2 split sizes in the table"; exit 1 }
    if (said != best) { print "FAIL: best split size printed " said ", the table'"'"'s fastest is " best; exit 1 }
    print "ok: best split size " said " is the fastest of the " rows " printed"
  }' "$log"
