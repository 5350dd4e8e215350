#!/bin/sh
# hybrid_run.sh NP PROGRAM: part 1 of chapter 5 as NP processes of 2 CPU devices each (memory --quick
# --num-gpus 2 --zero-stage 3 --steps 3), checking what rank 0 prints in its hybrid table (1b): 8 NP 2 rows
# (replicated; ZeRO-1 and ZeRO-2 with the shards over the ranks, every device, each process's devices;
# ZeRO-3 over each process's devices, whose parameters are shard i too, 4 Psi_i), each
# device's bytes measured from its allocator's tags against the model recomputed here from the
# printed Psi: parameters 4 Psi everywhere; .grad 4 Psi at stages 0 and 1, none at ZeRO-2; over the
# ranks rank r's first device keeps the state 8 Psi_r and at ZeRO-2 the summed gradient 4 Psi_r (Psi_r
# = floor(Psi (r+1) / NP) - floor(Psi r / NP)), its second device none; over the devices device i of
# every rank keeps 8 Psi_i and at ZeRO-2 4 Psi_i (the same split over 2); over every device, device i
# of rank r keeps 8 Psi_g, shard g = 2 r + i of the split over 2 NP, and at ZeRO-2 its own shard's
# sum 4 Psi_g; the seven check lines say every device of every rank equals the
# replicated run and rank 0.
np=$1
prog=$2
out=$(mktemp) || exit 99
trap 'rm -f "$out"' EXIT
sh "$(dirname "$0")/../../tests/dist/mpirun.sh" "$np" 200 "$prog" memory --quick --num-gpus 2 --zero-stage 3 --steps 3 >"$out" 2>&1
rc=$?
cat "$out"
[ "$rc" -eq 0 ] || { echo "FAIL: exit $rc"; exit 1; }
awk -v np="$np" '
  function chunk(p, r, n) { return int(p * (r + 1) / n) - int(p * r / n) }
  /^1b\. Hybrid sharding over/ { table = 1; if ($5 != np || $8 != 2) { print "FAIL: the title says " $5 " x " $8; bad++ } }
  table && /^Psi = [0-9]+,/ { psi = $3; sub(/,$/, "", psi) }
  table && ($1 == "replicated" || $1 == "over" || $1 == "every") && $0 ~ /[0-9]+:cpu\(/ {
    o = $1 == "replicated" ? 1 : 2; layout = $1 == "over" ? $2 : $1
    stage = $(o + 2); where = $(o + 3); r = where; sub(/:.*/, "", r); i = where; sub(/.*cpu\(/, "", i); sub(/\).*/, "", i)
    r += 0; i += 0; rows++
    shard = 0; summed = 0
    if (layout == "ranks" && i == 0) shard = summed = chunk(psi, r, np)
    if (layout == "devices") shard = summed = chunk(psi, i, 2)
    if (layout == "every") shard = summed = chunk(psi, 2 * r + i, 2 * np)
    params = stage == 3 ? 4 * shard : 4 * psi; grads = stage >= 2 ? 0 : 4 * psi; sums = stage >= 2 ? 4 * summed : 0; state = stage == 0 ? 8 * psi : 8 * shard
    w = layout " stage " stage " rank " r " device " i ": "
    if ($(o + 1) != 2 * np) { print "FAIL: " w "N = " $(o + 1) ", expected " 2 * np; bad++ }
    if ($(o + 4) != params || $(o + 6) != params) { print "FAIL: " w "params " $(o + 4) ", expected " params; bad++ }
    if ($(o + 7) != grads || $(o + 9) != grads) { print "FAIL: " w ".grad " $(o + 7) ", expected " grads; bad++ }
    if ($(o + 10) != sums || $(o + 12) != sums) { print "FAIL: " w "sum " $(o + 10) ", expected " sums; bad++ }
    if ($(o + 13) != state || $(o + 15) != state) { print "FAIL: " w "state " $(o + 13) ", expected " state; bad++ }
    if ($(o + 16) != 0) { print "FAIL: " w $(o + 16) " bytes of gathered units"; bad++ }
    if (layout != "replicated") held[layout, stage] += state
  }
  /^hybrid check, ZeRO-[123], shards (over ranks|every device|over devices): every device.s parameters on every rank equal/ && /are the same bits as rank 0/ { checks++ }
  END {
    if (psi == "") { print "FAIL: no Psi in the hybrid title"; bad++ }
    if (rows != 8 * 2 * np) { print "FAIL: " rows " hybrid rows, expected " 8 * 2 * np; bad++ }
    if (checks != 7) { print "FAIL: " checks " passing hybrid check lines, expected 7"; bad++ }
    # Over the ranks and over every device the pieces add up to one copy of the state over the world; over the devices to one copy per rank.
    for (s = 1; s <= 2; s++) {
      if (held["ranks", s] != 8 * psi) { print "FAIL: over the ranks at stage " s " the states add up to " held["ranks", s] ", expected " 8 * psi; bad++ }
      if (held["every", s] != 8 * psi) { print "FAIL: over every device at stage " s " the states add up to " held["every", s] ", expected " 8 * psi; bad++ }
      if (held["devices", s] != np * 8 * psi) { print "FAIL: over the devices at stage " s " the states add up to " held["devices", s] ", expected " np * 8 * psi; bad++ }
    }
    if (held["devices", 3] != np * 8 * psi) { print "FAIL: over the devices at stage 3 the states add up to " held["devices", 3] ", expected " np * 8 * psi; bad++ }
    exit bad ? 1 : 0
  }' "$out" || exit 1
echo "ok: the hybrid table over $np processes x 2 devices equals the model on every row, every device equals the replicated run"
