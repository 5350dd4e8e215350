#!/bin/sh
# quick_run.sh PROGRAM: chapter 5 end to end with --quick on 4 CPU devices, checking what it prints:
#   the memory table: on every row parameters = gradients = 4 Psi bytes, state = 8 Psi replicated and
#     8 Psi_i at ZeRO-1 (Psi_i = floor(Psi/N) + 1 for the first Psi mod N shards), recomputed here
#     from the printed Psi; the ZeRO-1 shards add up to one replicated copy; rows for N = 1, 2, 4;
#   the ZeRO-1 check lines for N = 1, 2, 4: the parameters equal the replicated run's (difference 0);
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
  $1 ~ /^[0-9]+$/ && ($2 == "0" || $2 == "1") && $3 ~ /^(cpu|emu|gpu)\(/ {
    n = $1; stage = $2; key = n " " stage; i = seen[key]++; rows++
    if (stage == 0) want = 8 * psi
    else want = 8 * (int(psi / n) + (i < psi % n ? 1 : 0))
    if ($4 != 4 * psi || $5 != 4 * psi) { print "FAIL: N=" n " stage " stage " device " i ": params/grads " $4 "/" $5 ", expected " 4 * psi; bad++ }
    if ($6 != want || $8 != want || $7 != (stage == 0 ? "8*Psi" : "8*Psi_" i)) { print "FAIL: N=" n " stage " stage " device " i ": state " $6 " (printed formula " $8 "), expected " want; bad++ }
    if (stage == 1) total[n] += $6
  }
  /^ZeRO-1 check, N=[0-9]+: .* equal the replicated run.s \(largest difference 0\)$/ { zero_ok++ }
  /^TP check: the MLP over 2 devices equals the unsharded run within rounding/ { tp_ok++ }
  /^communication per step \(batch 64\): 2 allreduces, 32768 bytes summed .* = 32768 bytes$/ { comm_ok++ }
  END {
    if (psi == 0) { print "FAIL: no Psi line"; bad++ }
    if (rows != 14) { print "FAIL: " rows " memory rows, expected 14 (N = 1, 2, 4, two stages)"; bad++ }
    for (n in total) if (total[n] != 8 * psi) { print "FAIL: the ZeRO-1 shards on " n " devices add up to " total[n] ", expected " 8 * psi; bad++ }
    if (zero_ok != 3) { print "FAIL: " zero_ok + 0 " ZeRO-1 check lines say equal, expected 3"; bad++ }
    if (tp_ok != 1) { print "FAIL: no tensor-parallel check line saying equal"; bad++ }
    if (comm_ok != 1) { print "FAIL: the bytes per step are not 2 allreduces of 32768 bytes"; bad++ }
    if (bad) exit 1
    print "ok: memory table = formula on " rows " rows (Psi = " psi "), ZeRO-1 = replicated, tensor parallel = unsharded, 32768 bytes a step"
  }' "$out"
