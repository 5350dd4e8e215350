#!/bin/sh
# quick_run.sh PROGRAM: chapter 5 end to end with --quick on 4 CPU devices, checking what it prints:
#   the memory table, rows for N = 1, 2, 4 and stages 0 to 3, each device's bytes measured from the
#     buffers its allocator handed out, by tag: on every row the parameters 4 Psi (4 Psi_i at ZeRO-3,
#     Psi_i = floor(Psi (i+1) / N) - floor(Psi i / N)), the .grad buffers 4 Psi (none at
#     ZeRO-2 and ZeRO-3), a summed gradient of its own only at ZeRO-2 and ZeRO-3 (4 Psi_i), the state
#     8 Psi replicated and 8 Psi_i sharded, no gathered unit left between steps: the paper's model,
#     against which the measurement could differ (an extra buffer would); the shards add up to one
#     replicated copy; every device sends 4 (Psi + (N-2) Psi_i) bytes a step at ZeRO-1 and ZeRO-2,
#     4 (Psi + (2N-3) Psi_i) at ZeRO-3, and all devices together 2(N-1) * 4 Psi (stages 0 to 2) or
#     3(N-1) * 4 Psi (stage 3);
#   the ladder: at N = 4 each stage's peak below the one before and ZeRO-3's at most half the
#     replicated run's; at N = 1 no stage above 1.05x the replicated peak;
#   the nine ZeRO check lines (stages 1 to 3, N = 1, 2, 4): the parameters equal the replicated
#     run's (difference 0); the twelve lines of bytes sent per step equal to their formula;
#   the tensor-parallel check line (equal within rounding) and the bytes per step: 2 allreduces of
#     batch * d_model floats, 2 * 64 * 64 * 4 = 32768 bytes.
prog=$1
out=$(mktemp) || exit 99
trap 'rm -f "$out"' EXIT
"$prog" --quick --num-gpus 4 >"$out" 2>&1
rc=$?
cat "$out"
[ "$rc" -eq 0 ] || { echo "FAIL: exit $rc"; exit 1; }
awk '
  /Psi = [0-9]+ trainable/ { for (i = 1; i <= NF; i++) if ($i == "Psi" && $(i + 1) == "=") psi = $(i + 2) }
  $1 ~ /^[0-9]+$/ && $2 ~ /^[0-3]$/ && $3 ~ /^(cpu|emu|gpu)\(/ {
    n = $1; stage = $2; key = n " " stage; i = seen[key]++; rows++
    shard = int(psi * (i + 1) / n) - int(psi * i / n)
    params = stage == 3 ? 4 * shard : 4 * psi
    buffers = stage >= 2 ? 0 : 4 * psi
    sums = stage >= 2 ? 4 * shard : 0
    state = stage == 0 ? 8 * psi : 8 * shard
    sent = n == 1 ? 0 : (stage == 3 ? 4 * (psi + (2 * n - 3) * shard) : 4 * (psi + (n - 2) * shard))
    where = "N=" n " stage " stage " device " i ": "
    if ($4 != params || $6 != params) { print "FAIL: " where "params " $4 " (formula " $6 "), expected " params; bad++ }
    if ($7 != buffers || $9 != buffers) { print "FAIL: " where ".grad buffers " $7 " (formula " $9 "), expected " buffers; bad++ }
    if ($10 != sums || $12 != sums) { print "FAIL: " where "summed gradient " $10 " (formula " $12 "), expected " sums; bad++ }
    if ($13 != state || $15 != state) { print "FAIL: " where "state " $13 " (formula " $15 "), expected " state; bad++ }
    if ($16 != 0) { print "FAIL: " where $16 " bytes of gathered units left between steps"; bad++ }
    if (stage >= 1 && $19 != sent) { print "FAIL: " where "sent " $19 " bytes a step, expected " sent; bad++ }
    if (stage > 0) state_total[key] += $13
    if (stage >= 2) grads_total[key] += $10
    if (stage == 3) params_total[n] += $4
    sent_total[key] += $19
  }
  /^ladder, N=4: .*: each stage below the one before$/ {
    r3 = $0; sub(/^.*, /, "", r3); sub(/x the replicated.*/, "", r3)
    if (r3 + 0 <= 0.5) ladder_ok++; else { print "FAIL: ZeRO-3 at " r3 "x the replicated peak, expected <= 0.5"; bad++ }
  }
  /^peak per device, N=1, stage [123]: / {
    r = $0; sub(/^.*bytes, /, "", r); sub(/x .*/, "", r)
    if (r + 0 <= 1.05) one_ok++; else { print "FAIL: " $0 " (above 1.05x at N = 1)"; bad++ }
  }
  /^ZeRO-[123] check, N=[0-9]+: .* equal the replicated run.s \(largest difference 0\)$/ { zero_ok++ }
  /^bytes sent per step, N=[0-9]+, stage [0-3] / {
    got = $0; sub(/^[^:]*: /, "", got); sub(/,.*/, "", got)
    want = $0; sub(/^.*formula [^=]*= /, "", want); sub(/[^0-9].*/, "", want)
    got += 0; want += 0
    nn = $5; sub(/N=/, "", nn); sub(/,/, "", nn); st = $7
    f = (st == 3 ? 3 : 2) * (nn - 1) * 4 * psi
    if (got != want || got != f || sent_total[nn " " st] != f) { print "FAIL: " $0 " (expected " f ", the rows add up to " sent_total[nn " " st] ")"; bad++ }
    else sent_ok++
  }
  /^TP check: the MLP over 2 devices equals the unsharded run within rounding/ { tp_ok++ }
  /^communication per step \(batch 64\): 2 allreduces, 32768 bytes summed .* = 32768 bytes$/ { comm_ok++ }
  END {
    if (psi == 0) { print "FAIL: no Psi line"; bad++ }
    if (rows != 28) { print "FAIL: " rows " memory rows, expected 28 (N = 1, 2, 4, four stages)"; bad++ }
    for (k in state_total) if (state_total[k] != 8 * psi) { print "FAIL: the shards of N, stage = " k " add up to " state_total[k] ", expected " 8 * psi; bad++ }
    for (k in grads_total) if (grads_total[k] != 4 * psi) { print "FAIL: the gradient shards of N, stage = " k " add up to " grads_total[k] ", expected " 4 * psi; bad++ }
    for (n in params_total) if (params_total[n] != 4 * psi) { print "FAIL: the ZeRO-3 parameter shards on " n " devices add up to " params_total[n] ", expected " 4 * psi; bad++ }
    if (ladder_ok != 1) { print "FAIL: no ladder line at N = 4 with each stage below the one before"; bad++ }
    if (one_ok != 3) { print "FAIL: " one_ok + 0 " of 3 stages within 1.05x of the replicated peak at N = 1"; bad++ }
    if (zero_ok != 9) { print "FAIL: " zero_ok + 0 " ZeRO check lines say equal, expected 9"; bad++ }
    if (sent_ok != 12) { print "FAIL: " sent_ok + 0 " lines of bytes sent equal their formula, expected 12"; bad++ }
    if (tp_ok != 1) { print "FAIL: no tensor-parallel check line saying equal"; bad++ }
    if (comm_ok != 1) { print "FAIL: the bytes per step are not 2 allreduces of 32768 bytes"; bad++ }
    if (bad) exit 1
    print "ok: memory table = formula on " rows " rows (Psi = " psi "), bytes sent = formula, ZeRO-1 = ZeRO-2 = ZeRO-3 = replicated, the ladder at N = 4 (ZeRO-3 at " r3 "x), tensor parallel = unsharded, 32768 bytes a step"
  }' "$out"
