#!/bin/sh
# mpirun_bad_input.sh MPIRUN_SH PROGRAM: bad inputs under mpirun that a table run as one process
# cannot reach (the grid's --tp-size that 1 divides, a batch that one dp group can take; part 1's batch
# smaller than the ranks' devices together). Each must end every rank within 60 s with exit code 2
# and exactly one line of the program on stderr ("error: ...") naming the flag: rank 0 alone says it.
# Lines: NP|WORD|ARGS (the part first, then --quick's run with the flags).
mpirun_sh=$1
prog=$2
. "$(dirname "$mpirun_sh")/refused.sh"
err=$(mktemp) || exit 99
trap 'rm -f "$err"' EXIT
failed=0
n=0
while IFS='|' read -r np word args; do
  n=$((n + 1))
  # shellcheck disable=SC2086
  sh "$mpirun_sh" "$np" 60 "$prog" --quick $args </dev/null >/dev/null 2>"$err"  # mpirun would read the cases
  report_refusal $? "$err" "$word" "-np $np --quick $args" || failed=$((failed + 1))
done <<'CASES'
4|--tp-size|grid --tp-size 3
4|--tp-size|grid --tp-size 8
4|--tp-size|grid --tp-size 0
2|--tp-size|grid --tp-size 4
4|--tp-size|grid --hidden 6 --tp-size 4
4|--batch-size|grid --batch-size 3 --tp-size 1
2|--batch-size|memory --num-gpus 2 --batch-size 3
2|--batch-size|memory --num-gpus 2 --batch-size 1022
CASES
[ "$failed" -eq 0 ] || { echo "$failed of $n bad inputs not refused as expected"; exit 1; }
echo "ok: $n bad inputs under mpirun, one line each"
