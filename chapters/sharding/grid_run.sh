#!/bin/sh
# grid_run.sh MPIRUN_SH PROGRAM NP TP [FLAGS...]: part 3 with --quick and FLAGS as NP processes (mpirun; NP = 1: the program
# alone, a world of one) in NP/TP dp x TP tp, checking what it prints: exit code 0; the mapping, one
# line per rank in rank order, against the layout computed here (rank r: dp rank r / TP, tp rank
# r % TP, tp group the TP consecutive ranks from TP (r / TP), dp group the ranks r % TP + k TP); the
# check line saying equal, with the largest relative differences it prints (the first 10 steps'
# losses, every rank's tensors after step 10) at most 1e-5, and every epoch's relative loss
# difference too; the replicas line; f and g sending 2 allreduces in the first step of the rank's
# 64 / dp examples x 64 features: 2 * (64 / dp) * 64 * 4 bytes; one optimizer-state line per rank,
# its measured bytes equal to the model's; with --clip-grad-norm, the clipping line's difference of
# the norms at most 1e-5 and the first step's norm above the max norm (the clipping acted).
mpirun_sh=$1
prog=$2
np=$3
tp=$4
shift 4
clip=0
case " $* " in *" --clip-grad-norm "*) clip=1 ;; esac
out=$(mktemp) || exit 99
trap 'rm -f "$out"' EXIT
if [ "$np" -eq 1 ]; then
  timeout -k 5 200 "$prog" grid --quick --tp-size "$tp" "$@" >"$out" 2>&1
else
  sh "$mpirun_sh" "$np" 200 "$prog" grid --quick --tp-size "$tp" "$@" >"$out" 2>&1
fi
rc=$?
cat "$out"
[ "$rc" -eq 0 ] || { echo "FAIL: exit $rc"; exit 1; }
awk -v np="$np" -v tp="$tp" -v clip="$clip" '
  function list(first, step, n,   s, i) {
    s = "["
    for (i = 0; i < n; i++) s = s (i ? ", " : "") (first + i * step)
    return s "]"
  }
  BEGIN { dps = np / tp; part = 64 / dps; bytes = 2 * part * 64 * 4 }
  /^rank [0-9]+: dp rank / {
    r = $2; sub(/:/, "", r); r += 0
    dp = int(r / tp); t = r % tp
    want = "rank " r ": dp rank " dp ", tp rank " t "; tp group " list(dp * tp, 1, tp) ", dp group " list(t, tp, dps)
    got = $0; sub(/ \(on .*\)$/, "", got)
    if (got != want || r != lines) { print "FAIL: mapping line " lines ": \"" got "\", expected \"" want "\""; bad++ }
    lines++
  }
  /^ +[0-9]+ +[0-9.]+ +[0-9.]+ +[0-9.e+-]+ +[0-9.]+ +[0-9.]+$/ {
    epochs++
    if ($4 + 0 > 1e-5) { print "FAIL: epoch " $1 " losses " $2 " and " $3 " differ by " $4 " relative"; bad++ }
  }
  index($0, "grid check: " dps " dp x " tp " tp over " np " process") == 1 && / equals the unsharded run within rounding over the first 10 steps/ {
    l = $0; sub(/.*largest relative difference of the losses /, "", l); sub(/,.*/, "", l)
    t = $0; sub(/.*unsharded ones after step [0-9]+ /, "", t); sub(/;.*/, "", t)
    if (l !~ /^[0-9.e+-]+$/ || t !~ /^[0-9.e+-]+$/ || l + 0 > 1e-5 || t + 0 > 1e-5) {
      print "FAIL: the check line says equal with differences \"" l "\" (losses) and \"" t "\" (tensors)"; bad++
    } else check++
  }
  /^replicas: the outer layers and the row layer.s bias have the same bits on every rank/ { replicas++ }
  /^  rank [0-9]+: [0-9]+ bytes \(model [0-9]+; replicated [0-9]+\)$/ {
    got = $3; want = $6; sub(/;/, "", want)
    if (got != want || got + 0 <= 0) { print "FAIL: " $0; bad++ } else state++
  }
  /^clipping: / {
    d = $0; sub(/.*largest relative difference /, "", d); sub(/ .*/, "", d)
    n = $0; sub(/.*the first step.s /, "", n); sub(/,.*/, "", n)
    m = $0; sub(/.*max norm /, "", m); sub(/\).*/, "", m)
    if (d + 0 > 1e-5 || n + 0 <= m + 0) { print "FAIL: clipping " d " apart, first norm " n " against max norm " m; bad++ } else clipped++
  }
  index($0, "communication in the first step on rank 0: tp group 2 allreduces, " bytes " bytes (f and g, 2 * " part " * 64 * 4 = " bytes ")") == 1 { comm++ }
  END {
    if (lines != np) { print "FAIL: " lines + 0 " mapping lines, expected " np; bad++ }
    if (epochs != 2) { print "FAIL: " epochs + 0 " epoch rows, expected 2"; bad++ }
    if (check != 1) { print "FAIL: no grid check line saying equal"; bad++ }
    if (replicas != 1) { print "FAIL: no replicas line saying the same bits"; bad++ }
    if (comm != 1) { print "FAIL: f and g did not send 2 allreduces of " bytes " bytes in all"; bad++ }
    if (state != np) { print "FAIL: " state + 0 " optimizer-state lines equal to the model, expected " np; bad++ }
    if (clipped != clip) { print "FAIL: " clipped + 0 " clipping lines equal to the unsharded norms, expected " clip; bad++ }
    if (bad) exit 1
    print "ok: the " dps " x " tp " mapping, the grid equal to the unsharded run, replicas the same bits, " bytes " bytes over the tp group"
  }' "$out"
