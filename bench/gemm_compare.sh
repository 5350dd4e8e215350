#!/bin/sh
# bench/gemm_compare.sh: is the CPU GEMM robust to what OpenBLAS guesses about the CPU? In one run:
# 1. gemm_bench's table, 1 and 2 threads, with OPENBLAS_CORETYPE as the user has it (normally unset),
#    and OpenBLAS's column again with its kernel set forced to the best this CPU runs (SkylakeX on
#    AVX-512, Haswell on AVX2), to Haswell (an AVX2-only machine) and to Prescott (SSE: what it
#    falls back to on a CPU it does not know).
# 2. The training steps the GEMM serves, ours with the default GEMM (kernel3) under each setting and
#    with OpenBLAS's at its best: ResNet-18 (batch 256, 2 threads) next to PyTorch's in the same run,
#    and ResNet-50 (batch 16 of 3x128x128, 1 thread: chapter 3's model_parallel_bench).
# Then the ratios. Not part of the tests or CI; run it on an idle machine.
#   bench/gemm_compare.sh [BUILD_DIR]   (build first: ninja -C build bench/gemm_bench
#                                        bench/resnet18_step_bench bench/model_parallel_bench)
# Environment: REPEATS=2 (timed steps per figure), STEPS=1 (0 skips part 2), RESNET50=1.
set -eu

build=${1:-build}
repeats=${REPEATS:-2}
steps=${STEPS:-1}
resnet50=${RESNET50:-1}
py=/usr/bin/python3
here=$(cd "$(dirname "$0")" && pwd)
results=$(mktemp)
out=$(mktemp)
trap 'rm -f "$results" "$out"' EXIT
for exe in gemm_bench resnet18_step_bench model_parallel_bench; do
  [ -x "$build/bench/$exe" ] || { echo "error: $build/bench/$exe not found: build it first (ninja -C $build bench/$exe)" >&2; exit 2; }
done
best=Haswell
grep -qw avx512f /proc/cpuinfo && best=SkylakeX
user=${OPENBLAS_CORETYPE:-unset}
echo "gemm_compare.sh: OPENBLAS_CORETYPE=$user; OpenBLAS's best kernel set here: $best; load average $(cut -d' ' -f1-3 /proc/loadavg)"

run() {  # run TAG COMMAND...: shows the output and keeps its RESULT lines, their keys prefixed with TAG
  tag=$1
  shift
  echo
  echo "\$ OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-unset} $*"
  "$@" > "$out"
  cat "$out"
  awk -v t="$tag" '$1 == "RESULT" { print "RESULT", t "_" $2, $3 }' "$out" >> "$results"
}
with() {  # with CORETYPE TAG COMMAND...: runs it with OPENBLAS_CORETYPE set (unset: as the user has it)
  core=$1
  shift
  if [ "$core" = user ]; then run "$@"; else (OPENBLAS_CORETYPE=$core; export OPENBLAS_CORETYPE; run "$@"); fi
}

for t in 1 2; do
  with user user "$build/bench/gemm_bench" --threads $t
  for core in $best Haswell Prescott; do
    with $core "$core" "$build/bench/gemm_bench" --threads $t --members openblas
  done
done
if [ "$steps" = 1 ]; then
  for core in user Prescott $best; do
    with $core "$core" "$build/bench/resnet18_step_bench" --repeats "$repeats" --gemm auto
  done
  with $best "${best}_openblas" "$build/bench/resnet18_step_bench" --repeats "$repeats" --gemm openblas
  if "$py" -c 'import torch' 2>/dev/null; then
    with user torch "$py" "$here/pytorch_reference.py" resnet --threads 2 --batch 256 --repeats "$repeats"
  fi
  if [ "$resnet50" = 1 ]; then
    for core in user Prescott $best; do
      with $core "$core" "$build/bench/model_parallel_bench" --batch 16 --image 128 --split 16 --repeats "$repeats" \
        --setup 1x1 --gemm auto
    done
    with $best "${best}_openblas" "$build/bench/model_parallel_bench" --batch 16 --image 128 --split 16 \
      --repeats "$repeats" --setup 1x1 --gemm openblas
  fi
fi

get() { awk -v k="$1" '$1 == "RESULT" && $2 == k { v = $3 } END { print v }' "$results"; }
ratio() {  # ratio LABEL A_KEY B_KEY: A / B
  a=$(get "$2")
  b=$(get "$3")
  [ -n "$a" ] && [ -n "$b" ] && awk -v l="$1" -v a="$a" -v b="$b" 'BEGIN { printf "%s: %.4g / %.4g = %.2fx\n", l, a, b, a / b }'
  return 0
}
echo
echo "==== kernel3 (this CPU's widest ISA) / OpenBLAS forced to $best, GFLOP/s a thread (above 1.00x: kernel3 is faster)"
width=16
[ "$best" = Haswell ] && width=8
for t in 1 2; do
  for shape in r18_s1_dW r18_s4_fwd r18_s4_dX r18_s4_dW r18_wino_s1 r18_wino_s3 r18_dense lenet_conv2_fwd \
               square_256 square_1024 square_4096; do
    ratio "$t thread(s), $shape" "user_gemm_kernel3_${width}_t${t}_$shape" "${best}_gemm_openblas_t${t}_$shape"
  done
done
echo
echo "==== kernel3 AVX2 / OpenBLAS forced to Haswell (an AVX2-only machine)"
for t in 1 2; do
  for shape in r18_s1_dW r18_s4_fwd square_1024 square_4096; do
    ratio "$t thread(s), $shape" "user_gemm_kernel3_8_t${t}_$shape" "Haswell_gemm_openblas_t${t}_$shape"
  done
done
if [ "$steps" = 1 ]; then
  echo
  echo "==== training steps, seconds (min of $repeats): the default GEMM under each OpenBLAS setting / OpenBLAS's GEMM at $best"
  for core in user Prescott $best; do
    ratio "ResNet-18 step, OPENBLAS_CORETYPE=$core" "${core}_resnet18_step_t2" "${best}_openblas_resnet18_step_t2"
    ratio "ResNet-50 step, OPENBLAS_CORETYPE=$core" "${core}_resnet50_step_1x1" "${best}_openblas_resnet50_step_1x1"
  done
  ratio "ResNet-18 step, ours (default) / PyTorch" user_resnet18_step_t2 torch_pytorch_resnet18_step_t2
fi
