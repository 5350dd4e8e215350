#!/bin/sh
# parts_flags_run.sh PROGRAM: each part checks only its own flags, so runs that bad_input.table's
# refusals must not catch succeed: part 1 on one device with part 2's default --tp-size 2, part 2
# with a batch smaller than the devices (each takes all of it), a short last minibatch that still
# gives every device an example; --trace of part 1 as one process writes the timeline it names; and
# part 2 clips by the norm over the MLP's slices, equal to the unsharded model's (within 1e-5
# relative), its first step's norm above the max norm (the clipping acted).
prog=$1
work=$(mktemp -d) || exit 99
trap 'rm -rf "$work"' EXIT
failed=0
run() {  # WHAT ARGS...: exit 0 expected
  what=$1
  shift
  if timeout -k 5 120 "$prog" "$@" >"$work/out" 2>"$work/err"; then
    echo "ok: $what ($*)"
  else
    echo "FAIL: $what ($*): exit $?"
    sed 's/^/  /' "$work/err"
    failed=$((failed + 1))
  fi
}
run "part 1 ignores --tp-size" memory --quick --num-gpus 1 --steps 1 --zero-stage 1
run "part 2 takes a batch smaller than the devices" tp --quick --num-gpus 4 --batch-size 2 --num-epochs 1
run "a last minibatch of 2 over 2 devices" memory --quick --num-gpus 2 --batch-size 1022 --steps 2 --zero-stage 3
run "--trace with part 1" memory --quick --num-gpus 2 --steps 1 --trace "$work/step.json" --out-dir "$work"
[ -s "$work/step.json" ] && grep -q '"traceEvents"' "$work/step.json" || { echo "FAIL: --trace wrote no timeline"; failed=$((failed + 1)); }
grep -q "^trace: one ZeRO-3 step on 2 devices, [1-9][0-9]* stream tasks" "$work/out" || { echo "FAIL: no trace line"; failed=$((failed + 1)); }
run "part 2 with --clip-grad-norm" tp --quick --num-gpus 4 --tp-size 4 --num-epochs 1 --clip-grad-norm 0.1
awk '/^clipping: / { d = $0; sub(/.*largest relative difference /, "", d); sub(/ .*/, "", d)
                     n = $0; sub(/.*first step.s /, "", n); sub(/,.*/, "", n)
                     if (d + 0 <= 1e-5 && n + 0 > 0.1) ok = 1 }
     /^TP check: .* equals / { eq = 1 }
     END { exit !(ok && eq) }' "$work/out" || { echo "FAIL: part 2's clipping line or check"; grep -e '^clipping' -e '^TP check' "$work/out"; failed=$((failed + 1)); }
[ "$failed" -eq 0 ] || { echo "$failed runs failed"; exit 1; }
echo "ok: each part checks its own flags"
