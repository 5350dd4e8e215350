#!/bin/sh
# grid_bad_input.sh MPIRUN_SH PROGRAM: part 3's bad inputs under mpirun, where a table run as one
# process cannot reach them (a --tp-size that 1 divides, a batch that one dp group can take). Each
# must end every rank within 60 s with exit code 2 and exactly one line of the program on
# stderr ("error: ...") naming the flag: rank 0 alone says it. Lines: NP|WORD|ARGS.
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
  sh "$mpirun_sh" "$np" 60 "$prog" grid --quick $args </dev/null >/dev/null 2>"$err"  # mpirun would read the cases
  rc=$?
  why=$(refusal_problem "$rc" "$err" "$word")
  if [ -n "$why" ]; then
    echo "FAIL: -np $np grid --quick $args: $why"
    sed 's/^/  /' "$err"
    failed=$((failed + 1))
  else
    echo "ok: -np $np grid --quick $args: exit 2, $(grep '^error' "$err")"
  fi
done <<'CASES'
4|--tp-size|--tp-size 3
4|--tp-size|--tp-size 8
4|--tp-size|--tp-size 0
2|--tp-size|--tp-size 4
4|--tp-size|--hidden 6 --tp-size 4
4|--batch-size|--batch-size 3 --tp-size 1
CASES
[ "$failed" -eq 0 ] || { echo "$failed of $n bad inputs not refused as expected"; exit 1; }
echo "ok: $n bad inputs under mpirun, one line each"
