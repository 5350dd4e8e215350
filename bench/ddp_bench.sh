#!/bin/sh
# DDP's buckets against one flat allreduce after backward: chapter 4's part 2 (ResNet-18, 2 processes
# x 1 CPU device x 1 thread, batch 16 of 1x28x28 per process) over the default modelled link and on
# the real transport, in one run. Prints the step-time ratio flat / buckets (> 1: the buckets are
# faster) and the fraction of communication hidden behind backward for each bucket size.
#   bench/ddp_bench.sh [BUILD_DIR] [FLAGS...]     (an idle machine; run from the repository root)
build=${1:-build}
[ $# -gt 0 ] && shift
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
echo "OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-unset (OpenBLAS picks from the CPU)}"
mpirun -np 2 --oversubscribe --bind-to none "$build/chapters/distributed/distributed" ddp --out-dir '' "$@" 2>/dev/null |
  awk '
    /^over a MODELLED link|^on the real transport|^the same on the real transport/ { table = $0; print; next }
    /^one flat, after backward/ { flat = $(NF - 4); print; next }
    /^buckets [0-9.]+ MB, overlapped/ {
      print
      printf "    -> flat / buckets %s MB: %.2fx step time; hidden %s of the communication\n", $2, flat / $(NF - 4), $NF
      next
    }
    { print }'
