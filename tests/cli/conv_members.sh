#!/bin/sh
# conv_members.sh LOSS_TOL ACC_TOL PROGRAM ARGS...: runs PROGRAM ARGS once per member of the
# convolution family (--conv im2col, direct, winograd2, winograd, blocked, auto) and compares the lines
# "epoch N, ... loss L, ... acc A" (test acc or test_acc; the loss when printed): every member must
# agree with im2col within LOSS_TOL and ACC_TOL (the members round differently, the printed digits
# are the same or one apart). Each run in an empty directory, files removed after.
loss_tol=$1
acc_tol=$2
shift 2
prog=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
shift
work=$(mktemp -d) || exit 99
trap 'rm -rf "$work"' EXIT
members="im2col direct winograd2 winograd blocked auto"
for k in $members; do
  mkdir "$work/$k"
  (cd "$work/$k" && "$prog" "$@" --conv $k >"$work/$k.out" 2>"$work/$k.err") || {
    echo "FAIL: --conv $k exited $?: $(tail -n 1 "$work/$k.err")"
    exit 1
  }
  # "N LOSS ACC" per epoch line ("-" for a number the program does not print)
  awk '/^epoch [0-9]+,/ { l = "-"; a = "-"
         for (i = 1; i <= NF; i++) { if ($i == "loss") l = $(i + 1); if ($i == "acc" || $i == "test_acc") a = $(i + 1) }
         gsub(",", "", l); gsub(",", "", a); print $2 + 0, l, a }' "$work/$k.out" >"$work/$k.num"
  echo "--conv $k:"
  sed 's/^/  epoch, loss, test acc: /' "$work/$k.num"
done
[ -s "$work/im2col.num" ] || { echo "FAIL: no epoch lines"; cat "$work/im2col.out"; exit 1; }
status=0
for k in $members; do
  [ "$k" = im2col ] && continue
  paste -d ' ' "$work/$k.num" "$work/im2col.num" | awk -v k="$k" -v lt="$loss_tol" -v at="$acc_tol" '
    function far(x, y, t) { if (x == "-" && y == "-") return 0; d = x - y; if (d < 0) d = -d; return x == "-" || y == "-" || d > t }
    { n++; if ($1 != $4 || far($2, $5, lt) || far($3, $6, at)) { print "FAIL: epoch " $1 ": " k " loss " $2 " acc " $3 ", im2col loss " $5 " acc " $6; bad = 1 } }
    END { if (n == 0) { print "FAIL: no epochs"; exit 1 } if (bad) exit 1; print k " and im2col agree on " n " epochs (loss within " lt ", accuracy within " at ")" }' || status=1
done
exit $status
