#!/usr/bin/env bash
# The CUDA kernels' whole GPU check in one call, for a machine with a CUDA GPU, nvcc and PyTorch
# (Paddle not needed). From the repository root:
#   bash bench/gpu_check.sh [steps]     steps: any of build test bench sanitize graph (default: all five)
# OUT=folder for the logs (default /tmp/gpu-check); BUDGET_S=seconds for everything (default 480);
# VARIANTS="..." builds with other tuning macros the bench also times (bench/cuda_kernel_bench.py --variants);
# SAN_K=pytest -k expression of the sanitizers' test selection; SAN_TOOLS=which of them (default all three).
#   build     every csrc/cuda/*.cu as a library for this GPU, in parallel ($PPO_CUDA_LIBDIR, reused below)
#   test      tests/test_cuda_kernels.py and tests/test_cuda_kernels_real_size.py
#   bench     bench/cuda_kernel_bench.py --table (JSON in $OUT/bench.json)
#   sanitize  compute-sanitizer memcheck, racecheck and synccheck over the SAN_K selection
#   graph     the decode shapes captured in a CUDA graph and replayed (bench --graph)
# Writes summary.txt and one log per step to $OUT; the summary is printed last.
set -u
OUT=${OUT:-/tmp/gpu-check}; mkdir -p "$OUT"
BUDGET_S=${BUDGET_S:-480}; STEPS=${*:-build test bench sanitize graph}
SAN_K=${SAN_K:-"nan or (cuda_kernel_matches and (attention or sample))"}
T0=$(date +%s); S="$OUT/summary.txt"; : > "$S"
export PYTHONUNBUFFERED=1 PATH="$PATH:/usr/local/cuda/bin" PPO_CUDA_LIBDIR=${PPO_CUDA_LIBDIR:-/tmp/ppo-cuda-libs}
mkdir -p "$PPO_CUDA_LIBDIR"
log() { echo "$*" | tee -a "$S"; }
left() { echo $(( BUDGET_S - ($(date +%s) - T0) )); }
step() {  # step NAME TIMEOUT LOG CMD...
  local name=$1 want=$2 logf=$3; shift 3
  local l; l=$(left); local t=$(( want < l ? want : l ))
  [ "$t" -lt 10 ] && { log "$name: skipped (deadline)"; return 99; }
  local s; s=$(date +%s); echo "=== $name: $*" >> "$logf"
  timeout -k 10 "$t" "$@" >> "$logf" 2>&1; local rc=$?
  log "$name: rc=$rc $(( $(date +%s) - s ))s (limit ${t}s)"; return $rc
}
has() { case " $STEPS " in *" $1 "*) return 0;; esac; return 1; }
log "gpu: $(nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv,noheader 2>&1 | head -1); nvcc: $(nvcc --version 2>&1 | tail -1)"
if has build; then
  step build 150 "$OUT/build.log" python3 -c "
import sys, torch; sys.path.insert(0, 'tests'); import cuda_ctypes, shutil
arch = '%d%d' % torch.cuda.get_device_capability()
print(cuda_ctypes.kernel_libraries(['rms_norm', 'swiglu', 'pack_transposed', 'attention', 'sampling', 'step_update'],
                                   '$PPO_CUDA_LIBDIR', arch, shutil.which('nvcc')))"
fi
if has test; then
  step test 200 "$OUT/test.log" python3 -m pytest -q -p no:cacheprovider -n 4 -rs --durations=8 \
    tests/test_cuda_kernels.py tests/test_cuda_kernels_real_size.py
  log "test: $(grep -E '[0-9]+ (passed|failed)' "$OUT/test.log" | tail -1)"
  grep -E "^(FAILED|ERROR)" "$OUT/test.log" | head -20 | tee -a "$S"
fi
if has bench; then
  step bench 200 "$OUT/bench.log" python3 bench/cuda_kernel_bench.py --table --out "$OUT/bench.json" \
    ${VARIANTS:+--variants $VARIANTS}
  grep -vE "^===" "$OUT/bench.log" | tail -60 >> "$S"
fi
if has sanitize; then
  CS=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
  for tool in ${SAN_TOOLS:-memcheck racecheck synccheck}; do
    [ -n "$CS" ] || { log "compute-sanitizer: not found"; break; }
    limit=100; [ "$tool" = racecheck ] && limit=150
    step "$tool" $limit "$OUT/sanitize.log" env PYTORCH_NO_CUDA_MEMORY_CACHING=1 "$CS" --tool $tool --error-exitcode 9 \
      --target-processes all python3 -m pytest -q -p no:cacheprovider -n 0 \
      tests/test_cuda_kernels.py tests/test_cuda_kernels_real_size.py -k "$SAN_K"
    log "$tool: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sanitize.log" | tail -1)"
  done
fi
if has graph; then
  step graph 60 "$OUT/graph.log" python3 bench/cuda_kernel_bench.py --graph --table --iters 20
  grep -vE "^===" "$OUT/graph.log" | tail -12 >> "$S"
fi
log "total $(( $(date +%s) - T0 ))s"
cat "$S"
