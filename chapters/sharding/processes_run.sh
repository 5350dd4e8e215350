#!/bin/sh
# processes_run.sh NP PROGRAM: part 1 of chapter 5 as NP processes under mpirun (memory --quick),
# checking what rank 0 prints:
#   the memory table over the ranks, 3 NP rows (stages 0, 1, 2, one row per rank): parameters =
#     .grad buffers = 4 Psi bytes; the summed gradient kept 4 Psi at stages 0 and 1, 4 Psi_r at
#     ZeRO-2; the state 8 Psi replicated, 8 Psi_r at ZeRO-1 and ZeRO-2, with Psi_r = floor(Psi (r+1) / NP)
#     - floor(Psi r / NP) recomputed here from the printed Psi, and the printed formulas the same;
#     the chunks add up to one replicated copy (8 Psi of state, 4 Psi of summed gradient);
#   the ZeRO-1 and ZeRO-2 check lines: every rank's parameters equal the replicated run's and rank 0's.
np=$1
prog=$2
out=$(mktemp) || exit 99
trap 'rm -f "$out"' EXIT
sh "$(dirname "$0")/../../tests/dist/mpirun.sh" "$np" 200 "$prog" memory --quick >"$out" 2>&1
rc=$?
cat "$out"
[ "$rc" -eq 0 ] || { echo "FAIL: exit $rc"; exit 1; }
awk -v np="$np" '
  /Psi = [0-9]+ trainable/ { for (i = 1; i <= NF; i++) if ($i == "Psi" && $(i + 1) == "=") psi = $(i + 2) }
  /^1\. Memory per rank over [0-9]+ processes/ { if ($6 != np) { print "FAIL: the title says " $6 " processes, expected " np; bad++ } }
  $1 ~ /^[0-9]+$/ && ($2 == "0" || $2 == "1" || $2 == "2") && $3 ~ /^[0-9]+:(cpu|emu|gpu)\(/ {
    n = $1; stage = $2; r = $3; sub(/:.*/, "", r); r += 0; rows++
    chunk = int(psi * (r + 1) / n) - int(psi * r / n)
    grads = stage == 2 ? 4 * chunk : 4 * psi; grads_f = stage == 2 ? "4*Psi_" r : "4*Psi"
    state = stage == 0 ? 8 * psi : 8 * chunk; state_f = stage == 0 ? "8*Psi" : "8*Psi_" r
    where = "stage " stage " rank " r ": "
    if (n != np) { print "FAIL: " where "N = " n ", expected " np; bad++ }
    if ($4 != 4 * psi || $5 != 4 * psi) { print "FAIL: " where "params/grads " $4 "/" $5 ", expected " 4 * psi; bad++ }
    if ($6 != grads || $8 != grads || $7 != grads_f) { print "FAIL: " where "summed gradient " $6 " (printed formula " $7 " " $8 "), expected " grads; bad++ }
    if ($9 != state || $11 != state || $10 != state_f) { print "FAIL: " where "state " $9 " (printed formula " $10 " " $11 "), expected " state; bad++ }
    if (stage > 0) state_total[stage] += $9
    if (stage == 2) grads_total += $6
    seen[stage " " r]++
  }
  /^ZeRO-[12] check over [0-9]+ processes: .* equal(s| within rounding)? the replicated run.s \(largest difference [^)]*\) and are the same bits as rank 0.s$/ { ok++ }
  END {
    if (psi == 0) { print "FAIL: no Psi line"; bad++ }
    if (rows != 3 * np) { print "FAIL: " rows + 0 " memory rows, expected " 3 * np " (three stages, one row per rank)"; bad++ }
    for (s = 0; s <= 2; s++) for (r = 0; r < np; r++) if (seen[s " " r] != 1) { print "FAIL: stage " s " rank " r " has " seen[s " " r] + 0 " rows"; bad++ }
    for (s = 1; s <= 2; s++) if (state_total[s] != 8 * psi) { print "FAIL: the chunks of stage " s " add up to " state_total[s] ", expected " 8 * psi; bad++ }
    if (grads_total != 4 * psi) { print "FAIL: the ZeRO-2 gradient chunks add up to " grads_total ", expected " 4 * psi; bad++ }
    if (ok != 2) { print "FAIL: " ok + 0 " ZeRO-1/ZeRO-2 check lines say equal, expected 2"; bad++ }
    if (bad) exit 1
    print "ok: memory table over " np " ranks = formula on " rows " rows (Psi = " psi "), ZeRO-1 = ZeRO-2 = replicated on every rank"
  }' "$out"
