#!/bin/sh
# ranks_bad_input.sh PROGRAM: two ranks that differ in one flag or in their data (mpirun's MPMD form:
# rank 0 runs ARGS and RANK0_ARGS, rank 1 ARGS and RANK1_ARGS). Each must end every rank within 60 s
# with exit code 2 and exactly one line of the program on stderr ("error: ...", rank 0's) naming
# WORD: never a hang, a crash or an abort. Lines: WORD|ARGS|RANK0_ARGS|RANK1_ARGS ($DATA: prepared
# IDX directories, $WORK: a scratch directory).
prog=$1
. "$(cd "$(dirname "$0")/../../tests/dist" && pwd)/refused.sh"
command -v mpirun >/dev/null 2>&1 || { echo "mpirun not found (install openmpi-bin)" >&2; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,vader
WORK=$(mktemp -d) || exit 99
trap 'rm -rf "$WORK"' EXIT
DATA=$WORK/data
# IDX files: N images of S x S zero pixels and N labels 0, training and test sets alike.
idx() {  # DIR N S
  mkdir -p "$1"
  for p in train t10k; do
    { printf '\000\000\010\003\000\000\000'; printf "\\$(printf %03o "$2")"; printf '\000\000\000'
      printf "\\$(printf %03o "$3")"; printf '\000\000\000'; printf "\\$(printf %03o "$3")"
      head -c $(($2 * $3 * $3)) /dev/zero; } >"$1/$p-images-idx3-ubyte"
    { printf '\000\000\010\001\000\000\000'; printf "\\$(printf %03o "$2")"; head -c "$2" /dev/zero; } >"$1/$p-labels-idx1-ubyte"
  done
}
idx "$DATA/eight" 8 28
idx "$DATA/four" 4 28
idx "$DATA/small" 8 14
err=$WORK/err
failed=0
n=0
while IFS='|' read -r word args rank0 rank1; do
  n=$((n + 1))
  eval "set -- $args"
  common=""
  for a in "$@"; do common="$common '$a'"; done
  eval "set -- $rank0"
  extra0=""
  for a in "$@"; do extra0="$extra0 '$a'"; done
  eval "set -- $rank1"
  extra1=""
  for a in "$@"; do extra1="$extra1 '$a'"; done
  # shellcheck disable=SC2086
  eval "timeout -k 5 60 mpirun --oversubscribe --bind-to none -np 1 \"$prog\" $common $extra0 : -np 1 \"$prog\" $common $extra1" \
    </dev/null >/dev/null 2>"$err"
  report_refusal $? "$err" "$word" "$args, rank 0 [$rank0], rank 1 [$rank1]" || failed=$((failed + 1))
done <<'CASES'
--zero-stage|memory --quick --steps 2||--zero-stage 2
--batch-size|memory --quick --steps 2||--batch-size 32
--tp-size|--quick --steps 2 --num-epochs 1||--tp-size 1
--lr|--quick --steps 2 --num-epochs 1||--lr 0.05
--adam-lr|memory --quick --steps 2||--adam-lr 0.01
--seed|memory --quick --steps 2||--seed 1
--quick|memory --steps 2 --data-dir $DATA/eight||--quick
--trace|memory --quick --steps 2||--trace $WORK/step.json
--trace|memory --quick --steps 2|--trace $WORK/step.json|
--out-dir|memory --quick --steps 2||--out-dir $WORK
part|--quick --steps 2||memory
training examples|memory --steps 1 --batch-size 2 --num-gpus 1|--data-dir $DATA/eight|--data-dir $DATA/four
image shape|memory --steps 1 --batch-size 2 --num-gpus 1|--data-dir $DATA/eight|--data-dir $DATA/small
CASES
[ -e "$WORK/step.json" ] && { echo "FAIL: a trace was written by a run that was refused"; failed=$((failed + 1)); }
[ "$failed" -eq 0 ] || { echo "$failed of $n mismatches not refused as expected"; exit 1; }
echo "ok: $n mismatches between the ranks, one line each"
