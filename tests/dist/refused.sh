# refused.sh, sourced by the tables of inputs that every rank must refuse (chapters/sharding's
# ranks_bad_input.sh and mpirun_bad_input.sh). refusal_problem RC ERR WORD prints why a run that ended
# with exit code RC, its stderr in the file ERR, was not refused as it should be: within the time
# (not 124 or 137), with exit code 2, no rank crashed or aborted, and exactly one line of the
# program ("error: ...") that names WORD. It prints nothing when it was. report_refusal RC ERR WORD
# WHAT prints the verdict on the run WHAT: "ok: WHAT: exit 2, <its error line>", or "FAIL: WHAT: why"
# and its stderr (returning 1).
refusal_problem() {
  lines=$(grep -c '^error' "$2")
  named=$(grep '^error' "$2" | grep -c -- "$3")
  crashed=$(grep -c -i -e "segmentation fault" -e "core dumped" -e "signal 6" -e "signal 11" -e "corrupted" -e "malloc()" \
    -e "free()" -e "MPI_ABORT" "$2")
  if [ "$1" -eq 0 ]; then echo "exit code 0"
  elif [ "$1" -eq 124 ] || [ "$1" -eq 137 ]; then echo "still running after 60 s (a hang)"
  elif [ "$crashed" -ne 0 ]; then echo "a rank crashed or aborted"
  elif [ "$1" -ne 2 ]; then echo "exit code $1, expected 2 (bad input)"
  elif [ "$lines" -ne 1 ] || [ "$named" -ne 1 ]; then echo "$lines error lines, $named naming $3"
  fi
}

report_refusal() {
  why=$(refusal_problem "$1" "$2" "$3")
  if [ -n "$why" ]; then
    echo "FAIL: $4: $why"
    sed 's/^/  /' "$2"
    return 1
  fi
  echo "ok: $4: exit 2, $(grep '^error' "$2")"
}
