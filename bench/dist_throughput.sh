#!/bin/sh
# Processes against threads: chapter 2's training time per epoch as 2 processes x 1 device (mpirun,
# --kvstore dist_sync) and as 1 process x 2 CPU devices (--kvstore device), each device with one
# kernel thread, same global batch and learning rate; the lab's CNN on Fashion-MNIST and ResNet-18
# on a subset of it. Prints each run's epoch times and the throughput ratio (threads' time / processes').
#   bench/dist_throughput.sh [BUILD_DIR]      (an idle machine; run from the repository root)
build=${1:-build}
prog=$build/chapters/multi_gpu_concise/multi_gpu_concise
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mean_epoch() {  # the mean of "training time: X sec" over the epochs after the first (warm caches)
  awk '/training time:/ { n++; if (n > 1) { s += $5; m++ } } END { if (m) printf "%.2f", s / m; else print "nan" }'
}
run() {  # NAME ARGS...: both ways, then the ratio
  name=$1; shift
  procs=$(mpirun -np 2 --bind-to none "$prog" --kvstore dist_sync --threads 1 --plot '' "$@" 2>/dev/null | mean_epoch)
  threads=$("$prog" --num-gpus 2 --kvstore device --threads 1 --plot '' "$@" 2>/dev/null | mean_epoch)
  awk -v n="$name" -v p="$procs" -v t="$threads" \
    'BEGIN { printf "%-10s 2 processes x 1 device: %6.2f s/epoch   1 process x 2 devices: %6.2f s/epoch   throughput ratio %.2fx\n", n, p, t, t / p }'
}
echo "OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-unset (OpenBLAS picks from the CPU)}"
run lab-cnn --model lab-cnn --num-epochs 3
run resnet18 --model resnet18 --batch-size 64 --lr 0.05 --train-subset 640 --test-subset 100 --num-epochs 3
