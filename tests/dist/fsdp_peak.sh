#!/bin/sh
# ZeRO-3 over the ranks keeps 1/W of the parameters, gradients and state: the peak the allocator
# measures on a rank must fall as the ranks grow. Runs tests/test_fsdp_dist.cpp's peak case as 2 and
# as 4 processes and compares the lines rank 0 prints
# ("peak bytes a rank, Adam, W ranks: replicated R, ZeRO-3 S"): S at 4 ranks below S at 2, each below R.
#   fsdp_peak.sh PROGRAM
prog=$1
here=$(dirname "$0")
peak() {  # NP -> "R S", or nothing
  sh "$here/mpirun.sh" "$1" 100 "$prog" '--test-case=*peak the allocator measures*' 2>&1 |
    awk -v np="$1" '/peak bytes a rank/ { sub(/.*peak bytes/, "peak bytes"); if ($6 == np) { r = $9; sub(/,$/, "", r); print r, $11 } }'
}
two=$(peak 2)
four=$(peak 4)
[ -n "$two" ] && [ -n "$four" ] || { echo "FAIL: no peak line (2 ranks: '$two', 4 ranks: '$four')"; exit 1; }
set -- $two $four
echo "2 ranks: replicated $1, ZeRO-3 $2; 4 ranks: replicated $3, ZeRO-3 $4"
[ "$2" -lt "$1" ] && [ "$4" -lt "$3" ] || { echo "FAIL: ZeRO-3's peak is not below the replicated run's"; exit 1; }
[ "$4" -lt "$2" ] || { echo "FAIL: ZeRO-3's peak at 4 ranks ($4) is not below its peak at 2 ($2)"; exit 1; }
echo "ok: ZeRO-3's peak falls from $2 bytes (2 ranks) to $4 (4 ranks)"
