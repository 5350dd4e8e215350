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
#      ch2       chapter 2's ResNet-18, one epoch of all 60000 images, batch 256, on gpu:0 (seed 0)
#      ch2mma    the same epoch with --gemm mma: kernel5's convolutions on its mma core (mma.sync, cp.async)
#      ch2fp32   the same with --precision fp32
#      ch2lab    chapter 2's lab CNN, 3 epochs, on gpu:0
#      ch2x2     chapter 2's lab CNN on gpu:0,gpu:0 and on gpu:0, one epoch each (the same numbers)
#      ch3       chapter 3's --quick on gpu:0,gpu:0
#      equiv     chapter 1 in FP32 for 2 epochs on gpu:0 and on gpu:0,gpu:0: the same losses and accuracies
#      ch2trace  20 steps of chapter 2's ResNet-18 on gpu:0 with --trace (ch2_resnet18.trace.json), evaluated on
#                256 test images; the program prints the compute time by kind of op (core/trace.hpp op_times)
#      ch2seeds  chapter 2's ResNet-18 epoch again with seeds 1 and 2: TF32's accuracy after one epoch
#      ch2seedsfp32  the same two seeds with --precision fp32
#      ncu       Nsight Compute on kernel5's TF32 launches in ResNet-18's training, when ncu is there: two
#                forward-pass convolutions (ncu_fwd), then three of the backward passes (ncu_bwd)
#   Everything goes to OUT_DIR (default bench/results/gpu-DATE, or $OUT when set), in five files: log.txt
#   (each step's output under a header "==== NAME: COMMAND"), summary.md (one line per step, the RESULT
#   lines, then the figures the steps printed), summary.json (the steps' exit codes and seconds, and the
#   results), ch1_lenet.trace.json and ch2_resnet18.trace.json.
#
# One time budget for everything: $D2L_GPU_BUDGET_S seconds (default 480, for a 15-minute lease with room
# to start and to fetch the files). Each step runs under min(its own limit, what is left of the budget); a
# step that would start with less than 20 s left is skipped and recorded as such. Whatever stops the script
# (the end, an error, Ctrl-C, SIGTERM), a trap writes summary.md and summary.json from what has run.
#
# The results, one `RESULT name value` line each in summary.md (`RESULT name NA` where a step did not
# print it) and the object "results" in summary.json (null for NA):
#   resnet18_epoch_tf32_s     ch2's sec/epoch
#   resnet18_acc_tf32_mean    the mean test accuracy of seeds 0, 1, 2 in TF32 (ch2 and ch2seeds)
#   resnet18_acc_fp32_mean    the same in FP32 (ch2fp32 and ch2seedsfp32)
#   conv_step_ms, batchnorm_step_ms, optimizer_step_ms    ch2trace's compute time by kind of op over its
#                             20 training steps, per step (the 256-image evaluation is included: one
#                             forward pass, about 2% of the convolutions' time)
#   gemm_tf32_vs_cublas       gpu_gemm_bench at 4096: the best TF32 GEMM, kernel5 (tf32, wmma) or kernel6 (mma,
#                             mma.sync), over cuBLAS TF32
#   gemm_fp32_vs_cublas       gpu_gemm_bench at 4096: the best hand-written FP32 GEMM over cuBLAS FP32
#   gemm16_bf16_mma_vs_cublas gpu_gemm_bench at 4096: the bfloat16 kernel6 (mma.sync m16n8k16) over
#                             cublasGemmEx on bfloat16 (target >= 0.5)
#
# bench/on_gpu.sh --parse LOG [OUT_DIR]: only the summaries, from the log.txt of an earlier run (no GPU
# needed: how the parsing is tested, tests/on_gpu_parse.sh).
# Fashion-MNIST: $D2L_DATA_DIR, else Debian's dataset-fashion-mnist.
set -u

# ---- the summaries: what every step appended, and the results parsed from log.txt

budget=${D2L_GPU_BUDGET_S:-480}
ch2trace_steps=20  # ch2trace's training steps: --train-subset 5120 at batch 256
gpu_name="" cc="" log="" out="" summary_lines="" steps_json="" sep="" stopped_by="end" written=""
child="" current=""

# The output of step NAME in log.txt: the lines after its header "==== NAME: ..." up to the next header.
section() {
  awk -v name="$1" '/^==== / { inside = ($2 == name ":") ; next } inside' "$log" 2>/dev/null
}

# The value of `RESULT key value` in step NAME's output.
result_of() {  # result_of NAME KEY
  section "$1" | awk -v key="$2" '$1 == "RESULT" && $2 == key { v = $3 } END { if (v != "") print v }'
}

# Field 1 (the accuracy) or 2 (the seconds) of step NAME's last epoch line: chapter 2's "epoch E, training
# time: S sec, test_acc A", or chapter 1's "test acc: A, S sec/epoch on [...]".
epoch_line() {  # epoch_line NAME FIELD
  section "$1" | sed -n -e 's/^test acc: \([0-9.]*\), \([0-9.]*\) sec\/epoch.*/\1 \2/p' \
    -e 's/^epoch [0-9]*, training time: \([0-9.]*\) sec, test_acc \([0-9.]*\).*/\2 \1/p' | tail -1 | cut -d' ' -f"$2"
}

# The mean of the arguments when every one is a number, else nothing (a seed that did not finish: NA).
mean() {
  [ $# -gt 0 ] || return 0
  for v in "$@"; do [[ $v =~ ^[0-9]+(\.[0-9]*)?([eE][-+]?[0-9]+)?$ ]] || return 0; done
  echo "$@" | awk '{ s = 0; for (i = 1; i <= NF; ++i) s += $i; printf "%.4f\n", s / NF }'
}

# a / b when both are numbers and b is not 0, else nothing.
ratio() {
  [[ ${1:-} =~ ^[0-9.eE+-]+$ && ${2:-} =~ ^[0-9.eE+-]+$ ]] || return 0
  awk -v a="$1" -v b="$2" 'BEGIN { if (b != 0) printf "%.4f\n", a / b }'
}

# ch2trace's "compute ms by kind of op: convolutions C, batch_norm B, optimizer O, other R", the kind's
# milliseconds per training step; nothing when the trace stopped early (--trace-tasks: not every step in it).
per_step_ms() {  # per_step_ms KIND
  local s
  s=$(section ch2trace)
  grep -q "(the first ones: --trace-tasks)" <<<"$s" && return 0
  sed -n 's/^compute ms by kind of op: //p' <<<"$s" | tail -1 | tr ',' '\n' |
    awk -v kind="$1" -v steps="$ch2trace_steps" '$1 == kind { printf "%.3f\n", $2 / steps }'
}

# Every result as "name value" (value NA when missing), in the order summary.md lists them.
results() {
  local fp32_best="" tf32_best="" k v
  best() {  # best VAR KERNEL...: the highest GFLOP/s of those kernels at 4096 into VAR
    local var=$1
    shift
    for k in "$@"; do
      v=$(result_of tables "gpu_gemm4096_gflops_$k")
      [[ $v =~ ^[0-9.eE+-]+$ ]] && printf -v "$var" '%s' "$(awk -v a="$v" -v b="${!var:-0}" 'BEGIN { print (a > b ? a : b) }')"
    done
  }
  best fp32_best naive tiled regblock warptiled
  best tf32_best tf32 mma
  local -a pairs=(
    resnet18_epoch_tf32_s "$(epoch_line ch2 2)"
    resnet18_acc_tf32_mean "$(mean "$(epoch_line ch2 1)" "$(epoch_line ch2seed1 1)" "$(epoch_line ch2seed2 1)")"
    resnet18_acc_fp32_mean "$(mean "$(epoch_line ch2fp32 1)" "$(epoch_line ch2seed1fp32 1)" "$(epoch_line ch2seed2fp32 1)")"
    conv_step_ms "$(per_step_ms convolutions)"
    batchnorm_step_ms "$(per_step_ms batch_norm)"
    optimizer_step_ms "$(per_step_ms optimizer)"
    gemm_tf32_vs_cublas "$(ratio "$tf32_best" "$(result_of tables gpu_gemm4096_gflops_cuBLAS_TF32)")"
    gemm_fp32_vs_cublas "$(ratio "$fp32_best" "$(result_of tables gpu_gemm4096_gflops_cuBLAS)")"
    gemm16_bf16_mma_vs_cublas "$(ratio "$(result_of tables gpu_gemm16_4096_gflops_bf16_mma)" "$(result_of tables gpu_gemm16_4096_gflops_bf16_cuBLAS)")"
  )
  for ((i = 0; i < ${#pairs[@]}; i += 2)); do echo "${pairs[i]} ${pairs[i + 1]:-NA}"; done
}

json_string() { printf '"%s"' "$(printf '%s' "$1" | sed 's/\\/\\\\/g; s/"/\\"/g' | tr -d '\000-\037')"; }

# summary.md and summary.json from what has run so far; once (the EXIT trap after INT or TERM does nothing).
write_summaries() {
  [ -n "$written" ] && return 0
  written=1
  [ -n "$out" ] && [ -d "$out" ] || return 0
  local res
  res=$(results)
  {
    echo "{\"gpu\": $(json_string "$gpu_name"), \"compute_capability\": $(json_string "$cc"),"
    echo " \"date\": \"$(date -u +%F)\", \"budget_s\": $budget, \"stopped_by\": $(json_string "$stopped_by"),"
    echo " \"steps\": [$steps_json],"
    echo " \"results\": {"
    awk '{ printf "%s  \"%s\": %s", (NR > 1 ? ",\n" : ""), $1, ($2 == "NA" ? "null" : $2) } END { print "" }' <<<"$res"
    echo " }}"
  } >"$out/summary.json"
  {
    echo "# $gpu_name (sm_$cc), $(date -u +%F)"
    echo
    [ "$stopped_by" = end ] || echo "stopped by $stopped_by"
    printf '%s' "$summary_lines" | sed 's/^/- /'
    echo
    sed 's/^/RESULT /' <<<"$res"
    echo
    echo '```'
    grep -e "^==== [a-z0-9_]*:" -e "sec/epoch" -e "^epoch [0-9]*, " -e "training time" -e "all convs of" -e "at 4096" \
      -e "target" -e "test cases:" -e "peak" -e "logical" -e "within" -e "tiles forced" -e "idle fraction" \
      -e "compute ms by kind" -e "Throughput" -e "Achieved Occupancy" -e "implicit_tf32" -e "^square 4096" -e "^R18 s" \
      "$log" 2>/dev/null | cut -c1-200
    echo '```'
  } >"$out/summary.md"
  cat "$out/summary.md"
}

# A step's line in both summaries. rc: its exit status, or "skipped".
record() {  # record NAME RC SECONDS
  local line
  if [ "$2" = skipped ]; then
    line="$1: skipped (less than 20 s of the budget left)"
    steps_json+="$sep{\"step\": \"$1\", \"skipped\": true}"
  else
    line=$(printf '%s: exit %s, %.1f s' "$1" "$2" "$3")
    steps_json+=$(printf '%s{"step": "%s", "exit": %s, "seconds": %.1f}' "$sep" "$1" "$2" "$3")
  fi
  sep=", "
  summary_lines+="$line"$'\n'
  echo "$line"
}

if [ "${1:-}" = --parse ]; then  # the summaries of an earlier run's log, nothing run
  log=${2:?usage: bench/on_gpu.sh --parse LOG [OUT_DIR]}
  out=${3:-$(dirname "$log")}
  stopped_by="--parse of $log"
  write_summaries >/dev/null
  exit 0
fi

# ---- the run

on_signal() {  # the step running is stopped and recorded, then the summaries are written
  stopped_by=$1
  if [ -n "$child" ]; then
    kill -TERM "$child" 2>/dev/null
    wait "$child" 2>/dev/null
    record "$current" "$2" "$(awk -v a="$step_start" -v b="$(date +%s.%N)" 'BEGIN { print b - a }')" >/dev/null
    child=""
  fi
  write_summaries
  exit "$2"
}
trap write_summaries EXIT
trap 'on_signal SIGINT 130' INT
trap 'on_signal SIGTERM 143' TERM

out=${1:-${OUT:-bench/results/gpu-$(date +%Y%m%d)}}
mkdir -p "$out" || exit 1
log="$out/log.txt"
: >"$log"
command -v nvidia-smi >/dev/null 2>&1 || { stopped_by="no nvidia-smi"; echo "bench/on_gpu.sh: no nvidia-smi: this machine has no GPU" >&2; exit 2; }
gpu_name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
cc=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d .)
{ echo "==== nvidia-smi"; nvidia-smi; } >>"$log" 2>&1
steps=${D2L_GPU_STEPS:-tests tables ch1 ch1fp32 ch1x2 ch2 ch2mma ch2lab ch2x2 ch3 equiv ch2trace ch2seeds ch2fp32 ch2seedsfp32 ncu}
SECONDS=0  # the budget's clock

run() {  # run NAME SECONDS COMMAND...: the output into log.txt; exit status and seconds into the summaries
  local name=$1 limit=$2 left
  shift 2
  left=$((budget - SECONDS))
  if [ "$left" -lt 20 ]; then
    record "$name" skipped 0
    return 0
  fi
  [ "$left" -lt "$limit" ] && limit=$left
  current=$name
  step_start=$(date +%s.%N)
  echo "==== $name: $*" >>"$log"
  # In the background, and waited for: a signal's trap then runs at once, not when the step ends.
  timeout "$limit" "$@" >>"$log" 2>&1 &
  child=$!
  wait "$child"
  local rc=$?
  child=""
  record "$name" "$rc" "$(awk -v a="$step_start" -v b="$(date +%s.%N)" 'BEGIN { print b - a }')"
}

if [ -n "${D2L_GPU_BIN:-}" ] && [ -x "$D2L_GPU_BIN/multi_gpu_scratch" ] && ! ldd "$D2L_GPU_BIN"/* 2>&1 | grep -q "not found"; then
  bin=$D2L_GPU_BIN
  test_gpu_ops=$bin/test_gpu_ops gemm_bench=$bin/gpu_gemm_bench ch1=$bin/multi_gpu_scratch ch2=$bin/multi_gpu_concise
  ch3=$bin/model_parallel
  summary_lines+="programs: $bin (built elsewhere for sm_$cc)"$'\n'
else
  [ -n "${D2L_GPU_BIN:-}" ] && summary_lines+=$(ldd "$D2L_GPU_BIN"/* 2>&1 | grep "not found" | sort -u)$'\n'
  b=build-gpu
  [ -f "$b/build.ninja" ] || run setup 300 meson setup "$b" -Dmpi=disabled -Dbuildtype=release -Dgpu_archs="$cc"
  run build 600 ninja -C "$b" tests/gpu/test_gpu_ops bench/gpu_gemm_bench chapters/multi_gpu_scratch/multi_gpu_scratch \
    chapters/multi_gpu_concise/multi_gpu_concise chapters/model_parallel/model_parallel
  test_gpu_ops=$b/tests/gpu/test_gpu_ops gemm_bench=$b/bench/gpu_gemm_bench
  ch1=$b/chapters/multi_gpu_scratch/multi_gpu_scratch ch2=$b/chapters/multi_gpu_concise/multi_gpu_concise
  ch3=$b/chapters/model_parallel/model_parallel
fi
r18=("$ch2" --model resnet18 --devices gpu:0 --num-epochs 1 --plot '')
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
    ch2) run ch2 120 "${r18[@]}" ;;
    ch2mma) run ch2mma 120 "${r18[@]}" --gemm mma ;;
    ch2fp32) run ch2fp32 120 "${r18[@]}" --precision fp32 ;;
    ch2lab) run ch2lab 90 "$ch2" --model lab-cnn --devices gpu:0 --num-epochs 3 --plot '' ;;
    ch2x2)
      run ch2x2 90 "$ch2" --model lab-cnn --devices gpu:0,gpu:0 --num-epochs 1 --plot ''
      run ch2x1 90 "$ch2" --model lab-cnn --devices gpu:0 --num-epochs 1 --plot '' ;;
    ch3) run ch3 90 "$ch3" --quick --devices gpu:0,gpu:0 ;;
    equiv)
      run equiv_x1 60 "$ch1" --devices gpu:0 --num-epochs 2 --plot '' --precision fp32
      run equiv_x2 60 "$ch1" --devices gpu:0,gpu:0 --num-epochs 2 --plot '' --precision fp32 ;;
    ch2trace) run ch2trace 90 "${r18[@]}" --train-subset $((ch2trace_steps * 256)) --test-subset 256 \
      --trace "$out/ch2_resnet18.trace.json" --trace-tasks 60000 ;;
    ch2seeds)
      run ch2seed1 120 "${r18[@]}" --seed 1
      run ch2seed2 120 "${r18[@]}" --seed 2 ;;
    ch2seedsfp32)
      run ch2seed1fp32 120 "${r18[@]}" --seed 1 --precision fp32
      run ch2seed2fp32 120 "${r18[@]}" --seed 2 --precision fp32 ;;
    ncu)
      if command -v ncu >/dev/null 2>&1; then
        # The kernel's template argument names the pass (demangled: ...implicit::Forward>, ...BackwardData>,
        # ...BackwardWeight>); a few launches of each are skipped, past the first layers.
        sections=(--section SpeedOfLight --section Occupancy --section MemoryWorkloadAnalysis)
        run ncu_fwd 90 ncu --kernel-name-base demangled --kernel-name 'regex:implicit_tf32_kernel<.*Forward' \
          --launch-skip 5 --launch-count 2 "${sections[@]}" "${r18[@]}" --train-subset 2560 --test-subset 256
        run ncu_bwd 90 ncu --kernel-name-base demangled --kernel-name 'regex:implicit_tf32_kernel<.*Backward' \
          --launch-skip 10 --launch-count 3 "${sections[@]}" "${r18[@]}" --train-subset 2560 --test-subset 256
      fi ;;
    *) summary_lines+="bench/on_gpu.sh: unknown step '$step'"$'\n'; echo "bench/on_gpu.sh: unknown step '$step'" ;;
  esac
done
