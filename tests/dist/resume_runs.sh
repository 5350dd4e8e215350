#!/bin/sh
# resume_runs.sh MPIRUN_SH TEST: a sharded checkpoint written by one run and resumed by another run
# of another size (test_sharded_checkpoint's "separate runs" cases, D2L_SHARDED_RESUME): saved at
# 2 ranks, resumed at 1 and at 4; saved at 4 ranks, resumed at 2 and at 3. Each resumed run must
# continue as 10 steps straight within rounding.
mpirun_sh=$1
test=$2
dir=$(mktemp -d) || exit 99
trap 'rm -rf "$dir"' EXIT
run() {  # NP MODE:DIR
  echo "== -np $1 $2"
  D2L_SHARDED_RESUME=$2 sh "$mpirun_sh" "$1" 100 "$test" --test-case='separate runs*' || { echo "FAIL: -np $1 $2"; exit 1; }
}
run 2 "save:$dir/from2"
run 1 "resume:$dir/from2"
run 4 "resume:$dir/from2"
run 4 "save:$dir/from4"
run 2 "resume:$dir/from4"
run 3 "resume:$dir/from4"
echo "ok: saved at 2 and 4 ranks, resumed at 1, 4, 2 and 3"
