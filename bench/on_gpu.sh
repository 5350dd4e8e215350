#!/bin/sh
# bench/on_gpu.sh [OUT_DIR]: what a machine with a GPU measures, in one call (minutes): builds for the
# GPU present (its compute capability from nvidia-smi; without MPI, which such a machine may lack),
# then runs the GPU tests, the GEMM and conv2d tables (every member, kernel5 implicit GEMM included)
# and chapters 1 and 2 on gpu:0 with each GPU convolution member. Each program's output goes to a file
# of OUT_DIR (default bench/results/gpu-DATE, or $OUT when set); a summary is printed at the end.
set -u
out=${1:-${OUT:-bench/results/gpu-$(date +%Y%m%d)}}
mkdir -p "$out" || exit 1
command -v nvidia-smi >/dev/null 2>&1 || { echo "bench/on_gpu.sh: no nvidia-smi: this machine has no GPU" >&2; exit 2; }
nvidia-smi >"$out/nvidia-smi.txt" 2>&1
b=build-gpu
run() {  # run NAME SECONDS COMMAND...: the command's output in OUT/NAME.txt and its exit status
  name=$1 limit=$2
  shift 2
  start=$(date +%s)
  timeout "$limit" "$@" >"$out/$name.txt" 2>&1
  rc=$?
  echo "$name: exit $rc, $(( $(date +%s) - start )) s" | tee -a "$out/summary.txt"
}
: >"$out/summary.txt"
[ -f "$b/build.ninja" ] || run setup 300 meson setup "$b" -Dmpi=disabled
run build 900 ninja -C "$b" tests/gpu/test_gpu_ops bench/gpu_gemm_bench chapters/multi_gpu_scratch/multi_gpu_scratch \
  chapters/multi_gpu_concise/multi_gpu_concise
run test_gpu_ops 300 "$b/tests/gpu/test_gpu_ops" --kind gpu
run gpu_gemm_bench 600 "$b/bench/gpu_gemm_bench"
for conv in auto implicit im2col; do
  run "chapter1_$conv" 300 "$b/chapters/multi_gpu_scratch/multi_gpu_scratch" --devices gpu:0 --num-epochs 3 --conv "$conv" --plot ''
  run "chapter2_resnet18_$conv" 600 "$b/chapters/multi_gpu_concise/multi_gpu_concise" --model resnet18 --devices gpu:0 \
    --num-epochs 1 --conv "$conv" --plot ''
done
grep -h -e "sec/epoch" -e "training time" -e "all convs of a batch-256" -e "targets at 4096" -e "test cases:" "$out"/*.txt \
  | tee -a "$out/summary.txt"
