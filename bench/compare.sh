#!/bin/sh
# bench/compare.sh: our benchmarks and PyTorch's (bench/pytorch_reference.py) back to back, and the
# ratio ours / PyTorch of each figure ("LeNet epoch: 7.9 s vs PyTorch 11.3 s = 0.70x"; below 1 means
# we are faster). Each of our runs is followed at once by PyTorch's on the same work, so both see the
# same machine load. Not part of the tests or CI.
#   bench/compare.sh [BUILD_DIR]        (default: build; build the benchmarks there first:
#                                        ninja -C build bench/lenet_epoch_bench bench/resnet18_step_bench)
# Environment:
#   STEPS=60          LeNet training steps per timed repeat, extrapolated to the 235 of an epoch
#                     (STEPS=235 times whole epochs)
#   REPEATS=3         timed repeats per figure (min and median are printed; ratios use the min)
#   RESNET=1          0 skips the ResNet-18 step (batch 256: a minute or more per side here)
#   RESNET_BATCH=256
#   RESNET50=1        chapter 3's ResNet-50 step (model_parallel_bench, batch 16 of 3x128x128, 1 thread
#                     and all cores) next to bench/pytorch_resnet50.py's; 0 skips it
#   CONV=auto         the convolution member of our runs (--conv: im2col, auto, blocked, winograd, ...)
#   CONCISE=1         chapter 2 too: ResNet-18 written with the layer (resnet18_layer_bench) next to
#                     PyTorch's step, its 2 devices x 1 thread vs 1 x 1, and the Gluon lab's CNN epoch
#                     (lab_cnn_epoch_bench) next to PyTorch's; 0 skips them
#   LAB_STEPS=300     lab CNN training steps per timed repeat, extrapolated to the 938 of an epoch
#   NATIVE_OPENBLAS=0 1 unsets OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE for this command, so OpenBLAS
#                     picks its kernels itself as on a user's machine (PyTorch's dense layers use
#                     OpenBLAS too; its convolutions use oneDNN). Which kernels ran is printed.
# PyTorch comes from Debian's python3-torch, which belongs to Debian's /usr/bin/python3 (the python3
# first on PATH may be another interpreter); without it only our figures are printed.
set -eu

build=${1:-build}
steps=${STEPS:-60}
repeats=${REPEATS:-3}
resnet=${RESNET:-1}
resnet_batch=${RESNET_BATCH:-256}
concise=${CONCISE:-1}
resnet50=${RESNET50:-1}
conv=${CONV:-auto}
lab_steps=${LAB_STEPS:-300}
py=/usr/bin/python3
here=$(cd "$(dirname "$0")" && pwd)
results=$(mktemp)
trap 'rm -f "$results"' EXIT

if [ "${NATIVE_OPENBLAS:-0}" = 1 ]; then
  unset OPENBLAS_CORETYPE OPENBLAS_L2_SIZE
fi
need() {  # need HOW EXE...: each EXE built under $build/bench, or one error line saying HOW
  local how=$1
  shift
  for exe in "$@"; do
    [ -x "$build/bench/$exe" ] || { echo "error: $build/bench/$exe not found: $how" >&2; exit 2; }
  done
}
need "build the benchmarks first (they are not built by default): ninja -C $build bench/lenet_epoch_bench bench/resnet18_step_bench" \
  lenet_epoch_bench resnet18_step_bench
if [ "$concise" = 1 ]; then
  need "build it first (ninja -C $build bench/resnet18_layer_bench bench/lab_cnn_epoch_bench) or set CONCISE=0" \
    resnet18_layer_bench lab_cnn_epoch_bench
fi

torch=1
if ! "$py" -c 'import torch' 2>/dev/null; then
  torch=0
  echo "note: PyTorch is skipped: $py cannot import torch (apt-get install python3-torch)"
fi

echo "compare.sh: --conv $conv, OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-unset}, load average $(cut -d' ' -f1-3 /proc/loadavg)"

# Runs a command, shows its output, and keeps its "RESULT key value" lines.
run() {
  echo
  echo "\$ $*"
  "$@" | tee -a "$results"
}
ours_lenet() { run "$build/bench/lenet_epoch_bench" --steps "$steps" --repeats "$repeats" --setup "$1" --conv "$conv"; }
torch_lenet() { [ $torch = 1 ] && run "$py" "$here/pytorch_reference.py" lenet --threads "$1" --steps "$steps" --repeats "$repeats"; }

# setups OURS TORCH: our three setups, each single-device one followed by PyTorch's on as many threads.
setups() {
  "$1" 1x2
  "$2" 2 || true
  "$1" 1x1
  "$2" 1 || true
  "$1" 2x1
}
setups ours_lenet torch_lenet
if [ "$resnet" = 1 ]; then
  run "$build/bench/resnet18_step_bench" --batch "$resnet_batch" --repeats "$repeats" --conv "$conv"
  [ $torch = 1 ] && run "$py" "$here/pytorch_reference.py" resnet --threads 2 --batch "$resnet_batch" --repeats "$repeats"
  [ "$concise" = 1 ] && run "$build/bench/resnet18_layer_bench" --batch "$resnet_batch" --repeats "$repeats" --setup 1x2 --conv "$conv"
fi
if [ "$resnet50" = 1 ]; then
  need "build it first (ninja -C $build bench/model_parallel_bench) or set RESNET50=0" model_parallel_bench
  for setup in 1x1 1xT; do
    run "$build/bench/model_parallel_bench" --batch 16 --image 128 --split 16 --repeats "$repeats" --setup "$setup" --conv "$conv"
    t=1
    [ "$setup" = 1xT ] && t=$(nproc)
    [ $torch = 1 ] && { run "$py" "$here/pytorch_resnet50.py" --threads "$t" --batch 16 --image 128 --repeats "$repeats" || true; }
  done
fi
if [ "$concise" = 1 ]; then
  ours_lab() { run "$build/bench/lab_cnn_epoch_bench" --steps "$lab_steps" --repeats "$repeats" --setup "$1" --conv "$conv"; }
  torch_lab() { [ $torch = 1 ] && run "$py" "$here/pytorch_reference.py" labcnn --threads "$1" --steps "$lab_steps" --repeats "$repeats"; }
  setups ours_lab torch_lab
  if [ "$resnet" = 1 ]; then
    run "$build/bench/resnet18_layer_bench" --batch "$resnet_batch" --repeats "$repeats" --setup 1x1 --conv "$conv"
    run "$build/bench/resnet18_layer_bench" --batch "$resnet_batch" --repeats "$repeats" --setup 2x1 --conv "$conv"
  fi
fi

# The figures side by side.
get() { awk -v k="$1" '$1 == "RESULT" && $2 == k { v = $3 } END { print v }' "$results"; }
line() {  # line "label" ours_key torch_key torch_label
  ours=$(get "$2")
  theirs=$(get "$3")
  [ -n "$ours" ] || return 0
  if [ -n "$theirs" ]; then
    awk -v l="$1" -v a="$ours" -v b="$theirs" -v t="$4" 'BEGIN { printf "%s: %.2f s vs PyTorch %s %.2f s = %.2fx\n", l, a, t, b, a / b }'
  else
    awk -v l="$1" -v a="$ours" 'BEGIN { printf "%s: %.2f s (PyTorch skipped)\n", l, a }'
  fi
}
echo
echo "==== ours / PyTorch (min of $repeats repeats; wall time; below 1.00x = we are faster)"
line "LeNet epoch, 1 device x 2 threads" lenet_epoch_1x2 pytorch_lenet_epoch_t2 "(2 threads)"
line "LeNet epoch, 1 device x 1 thread " lenet_epoch_1x1 pytorch_lenet_epoch_t1 "(1 thread) "
line "LeNet epoch, CPU time, 2 threads " lenet_epoch_cpu_1x2 pytorch_lenet_epoch_cpu_t2 "(2 threads)"
line "LeNet epoch, CPU time, 1 thread  " lenet_epoch_cpu_1x1 pytorch_lenet_epoch_cpu_t1 "(1 thread) "
line "LeNet epoch, 2 devices x 1 thread" lenet_epoch_2x1 pytorch_lenet_epoch_t2 "(2 threads)"
awk -v a="$(get lenet_epoch_1x1)" -v b="$(get lenet_epoch_2x1)" \
  'BEGIN { if (a != "" && b != "") printf "LeNet 2 devices x 1 thread vs 1 device x 1 thread: %.2fx the throughput\n", a / b }'
line "ResNet-18 step, batch $resnet_batch, 2 threads" resnet18_step_t2 pytorch_resnet18_step_t2 "(2 threads)"
awk -v a="$(get resnet18_step_peak_rss_mb)" -v b="$(get pytorch_resnet18_step_peak_rss_mb)" \
  'BEGIN { if (a != "" && b != "") printf "ResNet-18 step, peak resident memory: %.0f MB vs PyTorch %.0f MB\n", a, b }'
cores=$(nproc)
line "ResNet-50 step, batch 16 of 3x128x128, 1 thread " resnet50_step_1x1 pytorch_resnet50_step_t1 "(1 thread) "
line "ResNet-50 step, batch 16 of 3x128x128, $cores threads" "resnet50_step_1x$cores" "pytorch_resnet50_step_t$cores" "($cores threads)"
if [ "$concise" = 1 ]; then
  echo "---- chapter 2 (targets: ResNet-18 step <= 0.80x, lab CNN epoch <= 0.60x PyTorch's; 2x1 vs 1x1 >= 1.8x)"
  line "ResNet-18 step with the layer, batch $resnet_batch, 2 threads" resnet18_layer_step_1x2 pytorch_resnet18_step_t2 "(2 threads)"
  line "Lab CNN epoch, 1 device x 2 threads" lab_cnn_epoch_1x2 pytorch_lab_cnn_epoch_t2 "(2 threads)"
  line "Lab CNN epoch, 1 device x 1 thread " lab_cnn_epoch_1x1 pytorch_lab_cnn_epoch_t1 "(1 thread) "
  line "Lab CNN epoch, CPU time, 2 threads " lab_cnn_epoch_cpu_1x2 pytorch_lab_cnn_epoch_cpu_t2 "(2 threads)"
  awk -v a="$(get lab_cnn_epoch_1x1)" -v b="$(get lab_cnn_epoch_2x1)" \
    'BEGIN { if (a != "" && b != "") printf "Lab CNN 2 devices x 1 thread (batch 128) vs 1 device x 1 thread (batch 64): %.2fx the throughput\n", a / b }'
  awk -v a="$(get resnet18_layer_step_1x1)" -v b="$(get resnet18_layer_step_2x1)" \
    'BEGIN { if (a != "" && b != "") printf "ResNet-18 with the layer, 2 devices x 1 thread vs 1 device x 1 thread, same batch: %.2fx the throughput\n", a / b }'
fi
echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
