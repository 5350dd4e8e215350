# Shared by the signal drivers (interrupt.sh, interrupt_resume.sh, kill_checkpoint.sh); sourced.
#   in_empty_dir PROGRAM: $prog becomes PROGRAM's absolute path; the working directory becomes an
#     empty $work/run, and $work (where the drivers keep the program's stdout and stderr) is
#     removed when the driver exits.
#   wait_for_checkpoint PID: waits (120 s at most) until ck.safetensors exists; fails the test if
#     PID exits first.
in_empty_dir() {
  prog=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
  work=$(mktemp -d) || exit 99
  trap 'rm -rf "$work"' EXIT
  mkdir "$work/run"
  cd "$work/run" || exit 99
}

wait_for_checkpoint() {
  waited=0
  until [ -s ck.safetensors ]; do
    sleep 0.05
    kill -0 "$1" 2>/dev/null || { echo "FAIL: exited before its first checkpoint: $(tail -n 1 "$work/err")"; exit 1; }
    waited=$((waited + 1))
    if [ $waited -ge 2400 ]; then echo "FAIL: no checkpoint after 120 s"; kill -KILL "$1"; exit 1; fi
  done
}
