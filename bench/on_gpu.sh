#!/bin/bash
# bench/on_gpu.sh [OUT_DIR]: what a machine with a GPU measures, in one call of a few minutes.
#   1. the programs: those of $D2L_GPU_BIN when it is set and they load (built elsewhere with
#      -Dgpu_archs=<this GPU> -Dmpi=disabled), else a build for the GPU present (its compute capability
#      from nvidia-smi; without MPI, which such a machine may lack);
#   2. the steps of $D2L_GPU_STEPS (default: all), each under its own time limit:
#      tests     tests/gpu/test_gpu_ops --kind gpu
#      tables    bench/gpu_gemm_bench: the GEMM family and the conv2d members against cuBLAS
#      ch1       chapter 1's LeNet on gpu:0 (3 epochs), and its first steps' --trace
#      ch1x2     chapter 1 on two logical devices of GPU 0 (gpu:0,gpu:0)
#      ch2       chapter 2's ResNet-18, one epoch of all 60000 images, batch 256, on gpu:0
#      ch2lab    chapter 2's lab CNN, 3 epochs, on gpu:0
#      ch2x2     chapter 2's ResNet-18 on gpu:0,gpu:0, one epoch
#      ch3       chapter 3's --quick on gpu:0,gpu:0
#   Each program's output goes to OUT_DIR/<step>.txt (default bench/results/gpu-DATE, or $OUT when
#   set); summary.md (one line per step, then the figures each printed) and summary.json at the end.
# Fashion-MNIST: $D2L_DATA_DIR, else Debian's dataset-fashion-mnist.
set -u
out=${1:-${OUT:-bench/results/gpu-$(date +%Y%m%d)}}
mkdir -p "$out" || exit 1
command -v nvidia-smi >/dev/null 2>&1 || { echo "bench/on_gpu.sh: no nvidia-smi: this machine has no GPU" >&2; exit 2; }
gpu_name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
cc=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d .)
nvidia-smi >"$out/nvidia-smi.txt" 2>&1
steps=${D2L_GPU_STEPS:-tests tables ch1 ch1x2 ch2 ch2lab ch2x2 ch3}
: >"$out/summary.txt"
json="$out/summary.json"
echo "{\"gpu\": \"$gpu_name\", \"compute_capability\": \"$cc\", \"date\": \"$(date -u +%F)\", \"steps\": [" >"$json"
sep=""
run() {  # run NAME SECONDS COMMAND...: the output in OUT/NAME.txt; exit status and seconds in the summaries
  local name=$1 limit=$2
  shift 2
  local start rc secs
  start=$(date +%s.%N)
  timeout "$limit" "$@" >"$out/$name.txt" 2>&1
  rc=$?
  secs=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { print b - a }')
  printf '%s: exit %s, %.1f s\n' "$name" "$rc" "$secs" | tee -a "$out/summary.txt"
  printf '%s{"step": "%s", "exit": %s, "seconds": %.1f}' "$sep" "$name" "$rc" "$secs" >>"$json"
  sep=", "
}
bin=""
if [ -n "${D2L_GPU_BIN:-}" ] && [ -x "$D2L_GPU_BIN/multi_gpu_scratch" ] && ! ldd "$D2L_GPU_BIN"/* 2>&1 | grep -q "not found"; then
  bin=$D2L_GPU_BIN
  test_gpu_ops=$bin/test_gpu_ops gemm_bench=$bin/gpu_gemm_bench ch1=$bin/multi_gpu_scratch ch2=$bin/multi_gpu_concise
  ch3=$bin/model_parallel
  echo "programs: $bin (built elsewhere for sm_$cc)" | tee -a "$out/summary.txt"
else
  [ -n "${D2L_GPU_BIN:-}" ] && ldd "$D2L_GPU_BIN"/* 2>&1 | grep "not found" | sort -u | tee -a "$out/summary.txt"
  b=build-gpu
  [ -f "$b/build.ninja" ] || run setup 300 meson setup "$b" -Dmpi=disabled -Dbuildtype=release -Dgpu_archs="$cc"
  run build 600 ninja -C "$b" tests/gpu/test_gpu_ops bench/gpu_gemm_bench chapters/multi_gpu_scratch/multi_gpu_scratch \
    chapters/multi_gpu_concise/multi_gpu_concise chapters/model_parallel/model_parallel
  test_gpu_ops=$b/tests/gpu/test_gpu_ops gemm_bench=$b/bench/gpu_gemm_bench
  ch1=$b/chapters/multi_gpu_scratch/multi_gpu_scratch ch2=$b/chapters/multi_gpu_concise/multi_gpu_concise
  ch3=$b/chapters/model_parallel/model_parallel
fi
for step in $steps; do
  case $step in
    tests) run tests 240 "$test_gpu_ops" --kind gpu ;;
    tables) run tables 180 "$gemm_bench" ;;
    ch1)
      run ch1 120 "$ch1" --devices gpu:0 --num-epochs 3 --plot ''
      run ch1_trace 60 "$ch1" --devices gpu:0 --num-epochs 1 --plot '' --trace "$out/ch1_lenet.trace.json" \
        --trace-tasks 4000 ;;
    ch1x2) run ch1x2 120 "$ch1" --devices gpu:0,gpu:0 --num-epochs 3 --plot '' ;;
    ch2) run ch2 150 "$ch2" --model resnet18 --devices gpu:0 --num-epochs 1 --plot '' ;;
    ch2implicit) run ch2implicit 150 "$ch2" --model resnet18 --devices gpu:0 --num-epochs 1 --plot '' --conv implicit ;;
    ch2lab) run ch2lab 120 "$ch2" --devices gpu:0 --num-epochs 3 --plot '' ;;
    ch2x2) run ch2x2 180 "$ch2" --model resnet18 --devices gpu:0,gpu:0 --num-epochs 1 --plot '' ;;
    ch3) run ch3 120 "$ch3" --quick --devices gpu:0,gpu:0 ;;
    *) echo "bench/on_gpu.sh: unknown step '$step'" | tee -a "$out/summary.txt" ;;
  esac
done
echo "]}" >>"$json"
{
  echo "# $gpu_name (sm_$cc), $(date -u +%F)"
  echo
  sed 's/^/- /' "$out/summary.txt"
  echo
  echo '```'
  grep -h -e "sec/epoch" -e "epoch" -e "training time" -e "all convs of" -e "targets\? at 4096" -e "target" \
    -e "test cases:" -e "peak" "$out"/*.txt | grep -v "^programs:" | head -80
  echo '```'
} >"$out/summary.md"
cat "$out/summary.md"
