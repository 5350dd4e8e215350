#!/bin/bash
# bench/on_gpu.sh [OUT_DIR]: what a machine with a GPU measures, in one call of a few minutes.
#   1. the programs: those of $D2L_GPU_BIN when it is set and they load (built elsewhere with
#      -Dgpu_archs=<this GPU> -Dmpi=disabled -Dbuildtype=release), else a build for the GPU present (its
#      compute capability from nvidia-smi; without MPI, which such a machine may lack);
#   2. the steps of $D2L_GPU_STEPS (default: all), each under its own time limit:
#      tests     tests/gpu/test_gpu_ops --kind gpu (two logical devices when the machine has one GPU)
#      tables    bench/gpu_gemm_bench: the GEMM family and the conv2d members against cuBLAS, FP32 and TF32
#      ch1       chapter 1's LeNet on gpu:0, 3 epochs (--precision auto: TF32), and one epoch's --trace
#      ch1fp32   the same 3 epochs with --precision fp32: the training curves side by side
#      ch1x2     chapter 1 on two logical devices of GPU 0 (gpu:0,gpu:0)
#      ch2       chapter 2's ResNet-18, one epoch of all 60000 images, batch 256, on gpu:0
#      ch2fp32   the same with --precision fp32
#      ch2lab    chapter 2's lab CNN, 3 epochs, on gpu:0
#      ch2x2     chapter 2's lab CNN on gpu:0,gpu:0 and on gpu:0, one epoch each (the same numbers)
#      ch3       chapter 3's --quick on gpu:0,gpu:0
#      equiv     chapter 1 in FP32 for 2 epochs on gpu:0 and on gpu:0,gpu:0: the same losses and accuracies
#      ch2trace  20 steps of chapter 2's ResNet-18 on gpu:0 with --trace (ch2_resnet18.trace.json)
#      ch2seeds  chapter 2's ResNet-18 epoch again with seeds 1 and 2: TF32's accuracy after one epoch
#      ncu       Nsight Compute on three of kernel5's TF32 launches in ResNet-18's training (when ncu is there)
#   Everything goes to OUT_DIR (default bench/results/gpu-DATE, or $OUT when set), in five files: log.txt
#   (each step's output under a header), summary.md (one line per step, then the figures the steps
#   printed), summary.json (the steps' exit codes and seconds), ch1_lenet.trace.json and
#   ch2_resnet18.trace.json.
# Fashion-MNIST: $D2L_DATA_DIR, else Debian's dataset-fashion-mnist.
set -u
out=${1:-${OUT:-bench/results/gpu-$(date +%Y%m%d)}}
mkdir -p "$out" || exit 1
command -v nvidia-smi >/dev/null 2>&1 || { echo "bench/on_gpu.sh: no nvidia-smi: this machine has no GPU" >&2; exit 2; }
gpu_name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
cc=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d .)
log="$out/log.txt"
{ echo "==== nvidia-smi"; nvidia-smi; } >"$log" 2>&1
steps=${D2L_GPU_STEPS:-tests tables ch1 ch1fp32 ch1x2 ch2 ch2lab ch2x2 ch3 equiv ch2trace ch2seeds ch2fp32 ncu}
summary=$(mktemp)
json="$out/summary.json"
echo "{\"gpu\": \"$gpu_name\", \"compute_capability\": \"$cc\", \"date\": \"$(date -u +%F)\", \"steps\": [" >"$json"
sep=""
run() {  # run NAME SECONDS COMMAND...: the output into log.txt; exit status and seconds into the summaries
  local name=$1 limit=$2
  shift 2
  local start rc secs
  start=$(date +%s.%N)
  echo "==== $name: $*" >>"$log"
  timeout "$limit" "$@" >>"$log" 2>&1
  rc=$?
  secs=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { print b - a }')
  printf '%s: exit %s, %.1f s\n' "$name" "$rc" "$secs" | tee -a "$summary"
  printf '%s{"step": "%s", "exit": %s, "seconds": %.1f}' "$sep" "$name" "$rc" "$secs" >>"$json"
  sep=", "
}
bin=""
if [ -n "${D2L_GPU_BIN:-}" ] && [ -x "$D2L_GPU_BIN/multi_gpu_scratch" ] && ! ldd "$D2L_GPU_BIN"/* 2>&1 | grep -q "not found"; then
  bin=$D2L_GPU_BIN
  test_gpu_ops=$bin/test_gpu_ops gemm_bench=$bin/gpu_gemm_bench ch1=$bin/multi_gpu_scratch ch2=$bin/multi_gpu_concise
  ch3=$bin/model_parallel
  echo "programs: $bin (built elsewhere for sm_$cc)" | tee -a "$summary"
else
  [ -n "${D2L_GPU_BIN:-}" ] && ldd "$D2L_GPU_BIN"/* 2>&1 | grep "not found" | sort -u | tee -a "$summary"
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
    ch1fp32) run ch1fp32 120 "$ch1" --devices gpu:0 --num-epochs 3 --plot '' --precision fp32 ;;
    ch1x2) run ch1x2 120 "$ch1" --devices gpu:0,gpu:0 --num-epochs 3 --plot '' ;;
    ch2) run ch2 120 "$ch2" --model resnet18 --devices gpu:0 --num-epochs 1 --plot '' ;;
    ch2fp32) run ch2fp32 120 "$ch2" --model resnet18 --devices gpu:0 --num-epochs 1 --plot '' --precision fp32 ;;
    ch2lab) run ch2lab 90 "$ch2" --model lab-cnn --devices gpu:0 --num-epochs 3 --plot '' ;;
    ch2x2)
      run ch2x2 90 "$ch2" --model lab-cnn --devices gpu:0,gpu:0 --num-epochs 1 --plot ''
      run ch2x1 90 "$ch2" --model lab-cnn --devices gpu:0 --num-epochs 1 --plot '' ;;
    ch3) run ch3 90 "$ch3" --quick --devices gpu:0,gpu:0 ;;
    equiv)
      run equiv_x1 60 "$ch1" --devices gpu:0 --num-epochs 2 --plot '' --precision fp32
      run equiv_x2 60 "$ch1" --devices gpu:0,gpu:0 --num-epochs 2 --plot '' --precision fp32 ;;
    ch2trace) run ch2trace 90 "$ch2" --model resnet18 --devices gpu:0 --num-epochs 1 --plot '' --train-subset 5120 \
      --trace "$out/ch2_resnet18.trace.json" --trace-tasks 12000 ;;
    ch2seeds)
      run ch2seed1 120 "$ch2" --model resnet18 --devices gpu:0 --num-epochs 1 --plot '' --seed 1
      run ch2seed2 120 "$ch2" --model resnet18 --devices gpu:0 --num-epochs 1 --plot '' --seed 2 ;;
    ncu)
      if command -v ncu >/dev/null 2>&1; then
        run ncu 90 ncu --kernel-name regex:implicit_tf32 --launch-skip 30 --launch-count 3 --section SpeedOfLight \
          --section Occupancy --section MemoryWorkloadAnalysis "$ch2" --model resnet18 --devices gpu:0 --num-epochs 1 \
          --plot '' --train-subset 2560
      fi ;;
    *) echo "bench/on_gpu.sh: unknown step '$step'" | tee -a "$summary" ;;
  esac
done
echo "]}" >>"$json"
{
  echo "# $gpu_name (sm_$cc), $(date -u +%F)"
  echo
  sed 's/^/- /' "$summary"
  echo
  echo '```'
  grep -e "^==== [a-z0-9]*:" -e "sec/epoch" -e "^epoch [0-9]*, " -e "training time" -e "all convs of" -e "at 4096" \
    -e "target" -e "test cases:" -e "peak" -e "logical" -e "within" -e "tiles forced" -e "idle fraction" -e "Throughput" -e "Achieved Occupancy" -e "implicit_tf32" -e "^square 4096" -e "^R18 s" "$log" | cut -c1-200
  echo '```'
} >"$out/summary.md"
rm -f "$summary"
cat "$out/summary.md"
