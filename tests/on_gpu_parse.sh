#!/bin/bash
# tests/on_gpu_parse.sh: bench/on_gpu.sh's summaries from a made-up log.txt (bench/on_gpu.sh --parse), no GPU
# needed: every RESULT line with the value the log gives (means over the seeds, per-step times of the trace,
# the GEMM ratios at 4096), NA where a step printed nothing, and summary.json valid JSON with the same values.
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() { echo "on_gpu_parse: $*" >&2; exit 1; }

# chapter 2's epoch line (multi_gpu_concise), and chapter 1's (multi_gpu_scratch) for the steps named ch1
epoch() { printf 'epoch 1: 100/235 minibatches, 3.2 sec\nepoch 1, training time: %s sec, test_acc %s\n' "$2" "$1"; }
{
  echo "==== nvidia-smi"
  echo "==== tables: gpu_gemm_bench"
  for kv in naive:3000 tiled:8000 regblock:12000 warptiled:34000 tf32:64000 mma:120000 cuBLAS:50000 cuBLAS_TF32:400000; do
    echo "RESULT gpu_gemm4096_gflops_${kv%%:*} ${kv#*:}"
  done
  for kv in tiled:20000 mma:300000 cuBLAS:600000; do echo "RESULT gpu_gemm16_4096_gflops_bf16_${kv%%:*} ${kv#*:}"; done
  echo "==== ch2: multi_gpu_concise --model resnet18"; epoch 0.86 7.5
  echo "==== ch2trace: multi_gpu_concise --trace"
  echo "trace: 9000 stream tasks over 3.10 s written to t.json"
  echo "compute ms by kind of op: convolutions 700.0, batch_norm 120.0, optimizer 10.0, other 300.0"
  echo "==== ch2seed1: multi_gpu_concise --seed 1"; epoch 0.84 7.4
  echo "==== ch2seed2: multi_gpu_concise --seed 2"; epoch 0.83 7.4
  echo "==== ch2fp32: multi_gpu_concise --precision fp32"; epoch 0.85 20.0
  echo "==== ch2seed1fp32: multi_gpu_concise --seed 1 --precision fp32"; epoch 0.84 20.0
  echo "==== ch2seed2fp32: multi_gpu_concise --seed 2 --precision fp32"
  echo "epoch 1: 100/235 minibatches"  # stopped before the end: no accuracy, the mean is NA
} >"$dir/log.txt"
"$root/bench/on_gpu.sh" --parse "$dir/log.txt" "$dir"

expect() {  # expect NAME VALUE
  grep -qx "RESULT $1 $2" "$dir/summary.md" || fail "expected 'RESULT $1 $2' in summary.md, got: $(grep "RESULT $1 " "$dir/summary.md")"
}
expect resnet18_epoch_tf32_s 7.5
expect resnet18_acc_tf32_mean 0.8433
expect resnet18_acc_fp32_mean NA
expect conv_step_ms 35.000
expect batchnorm_step_ms 6.000
expect optimizer_step_ms 0.500
expect gemm_tf32_vs_cublas 0.3000  # kernel6 (mma), the better of the two TF32 GEMMs
expect gemm_fp32_vs_cublas 0.6800
expect gemm16_bf16_mma_vs_cublas 0.5000
python3 - "$dir/summary.json" <<'PY' || fail "summary.json: not the JSON expected"
import json, sys
r = json.load(open(sys.argv[1]))["results"]
assert r["resnet18_acc_fp32_mean"] is None and r["conv_step_ms"] == 35.0 and r["gemm_fp32_vs_cublas"] == 0.68, r
PY

# A trace cut short by --trace-tasks holds only the first steps: no per-step figures.
sed -i 's/written to t.json/written to t.json (the first ones: --trace-tasks)/' "$dir/log.txt"
"$root/bench/on_gpu.sh" --parse "$dir/log.txt" "$dir"
expect conv_step_ms NA
echo "on_gpu_parse: ok"
