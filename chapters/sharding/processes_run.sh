#!/bin/sh
# processes_run.sh NP PROGRAM: part 1 of chapter 5 as NP processes of one device under mpirun (memory --quick),
# checking what rank 0 prints:
#   the memory table over the ranks, 4 NP rows (stages 0, 1, 2, 3, one row per rank), each rank's
#     bytes measured from its allocator's tags: parameters 4 Psi at stages 0 to 2, .grad buffers
#     4 Psi at stages 0 and 1 and none at ZeRO-2 (released once reduce-scattered) and ZeRO-3, a
#     summed gradient of its own 4 Psi_r at ZeRO-2, the state 8 Psi replicated, 8 Psi_r at ZeRO-1
#     and ZeRO-2, with Psi_r = floor(Psi (r+1) / NP) - floor(Psi r / NP) from the printed Psi; at
#     ZeRO-3 parameters, summed gradient and state 4, 4 and 8 Psi'_r, with Psi'_r the sum over the
#     layers u of floor(Psi_u (r+1) / NP) - floor(Psi_u r / NP), the layers' Psi_u from the printed
#     widths (784 -> H x L -> 10); no gathered unit left; the printed formulas the same; the chunks
#     of every sharded stage add up to one replicated copy;
#   the bytes sent a step, counted by dist::collective_counters: one row per stage whose total over the
#     ranks is k (NP-1) 4 Psi (k = 2 at stages 0 to 2, 3 at ZeRO-3), recomputed here from the printed
#     Psi, and whose mean per rank is (NP-1)/NP of k 4 Psi;
#   the ZeRO-1, ZeRO-2 and ZeRO-3 check lines: every rank's parameters equal the replicated run's and rank 0's;
#   --trace: one timeline with every rank's lanes, the ZeRO-3 step's all-gathers and reduce-scatters
#     on each rank's communication lane, and the line naming it.
np=$1
prog=$2
out=$(mktemp) || exit 99
trace=$(mktemp -u /tmp/zero3_trace_XXXXXX.json) || exit 99
trap 'rm -f "$out" "$trace"' EXIT
sh "$(dirname "$0")/../../tests/dist/mpirun.sh" "$np" 200 "$prog" memory --quick --num-gpus 1 --trace "$trace" >"$out" 2>&1
rc=$?
cat "$out"
[ "$rc" -eq 0 ] || { echo "FAIL: exit $rc"; exit 1; }
[ -s "$trace" ] || { echo "FAIL: no trace written"; exit 1; }
grep -q "^trace: one ZeRO-3 step over $np processes, [0-9]* stream tasks, every rank in one timeline" "$out" || { echo "FAIL: no trace line"; exit 1; }
r=0
while [ "$r" -lt "$np" ]; do
  for op in MPI_Iallgatherv MPI_Ireduce_scatter; do
    grep -q "\"name\": \"$op\", \"cat\": \"cpu([0-9]*) comm\", \"pid\": $r," "$trace" || { echo "FAIL: no $op on rank $r's comm lane in the trace"; exit 1; }
  done
  r=$((r + 1))
done
awk -v np="$np" -v q="'" '
  function chunk(p, r, n) { return int(p * (r + 1) / n) - int(p * r / n) }
  /Psi = [0-9]+ trainable/ { for (i = 1; i <= NF; i++) if ($i == "Psi" && $(i + 1) == "=") psi = $(i + 2)
                             if ($1 == "MLP") { features = $2; hidden = $4; layers = $6 } }
  /^1\. Memory per rank over [0-9]+ processes/ { if ($6 != np) { print "FAIL: the title says " $6 " processes, expected " np; bad++ } }
  $1 ~ /^[0-9]+$/ && ($2 == "0" || $2 == "1" || $2 == "2" || $2 == "3") && $3 ~ /^[0-9]+:(cpu|emu|gpu)\(/ {
    n = $1; stage = $2; r = $3; sub(/:.*/, "", r); r += 0; rows++
    if (stage == 3) {  # per layer: 784 -> H, (L - 1) x H -> H, H -> 10, weights and biases
      mine = chunk(features * hidden + hidden, r, n) + (layers - 1) * chunk(hidden * hidden + hidden, r, n) + chunk(hidden * 10 + 10, r, n)
      params = 4 * mine
    } else {
      mine = chunk(psi, r, n); params = 4 * psi
    }
    dot_grads = stage >= 2 ? 0 : 4 * psi
    sums = stage >= 2 ? 4 * mine : 0
    state = stage == 0 ? 8 * psi : 8 * mine
    where = "stage " stage " rank " r ": "
    if (n != np) { print "FAIL: " where "N = " n ", expected " np; bad++ }
    # measured (allocator tags) against this model, and the printed formula the same
    if ($4 != params || $6 != params) { print "FAIL: " where "params " $4 " (formula " $6 "), expected " params; bad++ }
    if ($7 != dot_grads || $9 != dot_grads) { print "FAIL: " where ".grad " $7 " (formula " $9 "), expected " dot_grads; bad++ }
    if ($10 != sums || $12 != sums) { print "FAIL: " where "summed gradient " $10 " (formula " $12 "), expected " sums; bad++ }
    if ($13 != state || $15 != state) { print "FAIL: " where "state " $13 " (formula " $15 "), expected " state; bad++ }
    if ($16 != 0) { print "FAIL: " where $16 " bytes of gathered units left between steps"; bad++ }
    if (stage > 0) state_total[stage] += $13
    if (stage >= 2) grads_total[stage] += $10
    if (stage == 3) params_total += $4
    seen[stage " " r]++
  }
  /^bytes sent a step per rank, counted by dist::collective_counters/ { sent_table = 1; next }
  sent_table && $1 == np && $2 ~ /^[0-3]$/ && NF == 9 {
    k = $2 == 3 ? 3 : 2; total = k * (np - 1) * 4 * psi; mean = (np - 1) / np * k * 4 * psi
    if ($7 != total || $9 != total) { print "FAIL: stage " $2 " sent " $7 " bytes over the ranks a step (printed formula " $9 "), expected " total; bad++ }
    if ($4 - mean > 0.05 || mean - $4 > 0.05 || $6 - mean > 0.05 || mean - $6 > 0.05) { print "FAIL: stage " $2 " sent " $4 " bytes a rank on average (printed formula " $6 "), expected " mean; bad++ }
    if ($3 < $4) { print "FAIL: stage " $2 " the largest rank sent " $3 " bytes, under the mean " $4; bad++ }
    sent_rows++
  }
  /^ZeRO-[123] check over [0-9]+ processes: .* equal(s| within rounding)? the replicated run.s \(largest difference [^)]*\) and are the same bits as rank 0.s$/ { ok++ }
  END {
    if (psi == 0) { print "FAIL: no Psi line"; bad++ }
    if (hidden == 0 || features * hidden + hidden + (layers - 1) * (hidden * hidden + hidden) + hidden * 10 + 10 != psi) { print "FAIL: the layers 784 -> H x L -> 10 (H = " hidden ", L = " layers ") do not add up to Psi = " psi; bad++ }
    if (rows != 4 * np) { print "FAIL: " rows + 0 " memory rows, expected " 4 * np " (four stages, one row per rank)"; bad++ }
    for (s = 0; s <= 3; s++) for (r = 0; r < np; r++) if (seen[s " " r] != 1) { print "FAIL: stage " s " rank " r " has " seen[s " " r] + 0 " rows"; bad++ }
    for (s = 1; s <= 3; s++) if (state_total[s] != 8 * psi) { print "FAIL: the chunks of stage " s " add up to " state_total[s] ", expected " 8 * psi; bad++ }
    for (s = 2; s <= 3; s++) if (grads_total[s] != 4 * psi) { print "FAIL: the ZeRO-" s " gradient chunks add up to " grads_total[s] ", expected " 4 * psi; bad++ }
    if (params_total != 4 * psi) { print "FAIL: the ZeRO-3 parameter chunks add up to " params_total ", expected " 4 * psi; bad++ }
    if (sent_rows != 4) { print "FAIL: " sent_rows + 0 " rows of bytes sent, expected 4 (stages 0 to 3)"; bad++ }
    if (ok != 3) { print "FAIL: " ok + 0 " ZeRO-1/ZeRO-2/ZeRO-3 check lines say equal, expected 3"; bad++ }
    if (bad) exit 1
    print "ok: memory table over " np " ranks = formula on " rows " rows (Psi = " psi "), bytes sent = formula at the 4 stages, ZeRO-1 = ZeRO-2 = ZeRO-3 = replicated on every rank"
  }' "$out"
