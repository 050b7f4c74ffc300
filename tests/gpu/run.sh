#!/usr/bin/env bash
# GPU checks for a machine with an NVIDIA H200 (sm_90) and the CUDA toolkit.
#
#   tests/gpu/run.sh [build_dir]      (default: build-gpu in the repo root)
#
# 1. Configures and builds Release with CUDA (arch 90).
# 2. Runs every test labelled gpu (worker_gpu_test, compression_gpu_test, and
#    python.device_path: asyncps.torch with a CUDA model, exact updates, PushDevice),
#    and OverlapIntegrationTest.CudaBspIsBitwiseEqual (ps_worker --overlap on the GPU).
# 3. Benchmarks ps_train_local end to end, CPU vs GPU, at batch 256 and 1024,
#    and trains 10 epochs on the GPU as an accuracy check. Prints one JSON
#    line per run (prefix "JSON "), with the GPU/CPU ratio of the same run.
# ASYNCPS_GPU_SKIP_BUILD=1 reuses an existing build. Each step has its own timeout; the whole script stays under 8 minutes.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BUILD="${1:-$ROOT/build-gpu}"
JOBS="$(nproc)"
DATA="${ASYNCPS_DATA_DIR:-/usr/share/datasets/fashion-mnist}"
START=$SECONDS
status=0

log() { echo "[gpu/run.sh +$((SECONDS - START))s] $*" >&2; }

nvidia-smi -L >&2 || log "nvidia-smi failed (no driver?); GPU tests will skip"

if [[ "${ASYNCPS_GPU_SKIP_BUILD:-0}" != 1 ]]; then
log "configure $BUILD"
timeout 120 cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CUDA_ARCHITECTURES=90 -DASYNCPS_ENABLE_CUDA=ON >"$BUILD.configure.log" 2>&1 ||
  { tail -40 "$BUILD.configure.log"; exit 1; }
grep -q "CUDA backends ON" "$BUILD.configure.log" || { log "CUDA was not found by CMake"; exit 1; }

log "build with $JOBS jobs"
timeout 240 cmake --build "$BUILD" -j"$JOBS" >"$BUILD.build.log" 2>&1 ||
  { tail -60 "$BUILD.build.log"; exit 1; }
fi

log "ctest -L gpu, and ps_worker --overlap on the GPU (real processes)"
(cd "$BUILD" && timeout 150 ctest -L gpu --output-on-failure --timeout 120) || status=1
(cd "$BUILD" && timeout 150 ctest -R '^OverlapIntegrationTest\.CudaBspIsBitwiseEqual$' \
  --output-on-failure --timeout 120) || status=1

BIN="$BUILD/bin/ps_train_local"
if [[ ! -d "$DATA" ]]; then
  log "no dataset at $DATA: skipping the benchmark"
  exit $status
fi

# run_train DEVICE BATCH THREADS MAX_STEPS EPOCHS -> prints the SUMMARY line.
run_train() {
  timeout 90 "$BIN" --data_dir="$DATA" --device="$1" --batch="$2" --threads="$3" \
    --max_steps="$4" --epochs="$5" --log_every=0 2>"$BUILD.bench.$1.$2.log" |
    grep '^SUMMARY' || { log "ps_train_local $1 batch $2 failed:"; tail -5 "$BUILD.bench.$1.$2.log" >&2; echo ""; }
}
field() { sed -n "s/.* $1=\([^ ]*\).*/\1/p" <<<"$2"; }

num() { local v; v=$(field "$1" "$2"); echo "${v:-null}"; }

for batch in 256 1024; do
  cpu_steps=$((batch == 256 ? 1500 : 400))
  cpu=$(run_train cpu "$batch" "$JOBS" "$cpu_steps" 0)
  gpu=$(run_train cuda "$batch" 1 4000 0)
  cpu_sps=$(num samples_per_s "$cpu"); gpu_sps=$(num samples_per_s "$gpu")
  ratio=$(awk -v g="$gpu_sps" -v c="$cpu_sps" \
    'BEGIN{ if (c != "null" && g != "null" && c > 0) printf "%.2f", g / c; else print "null" }')
  echo "JSON {\"bench\":\"ps_train_local\",\"model\":\"784-256-128-10\",\"batch\":$batch,\"device\":\"cpu\",\"threads\":$JOBS,\"steps\":$cpu_steps,\"samples_per_s\":$cpu_sps,\"test_acc\":$(num final_test_acc "$cpu")}"
  echo "JSON {\"bench\":\"ps_train_local\",\"model\":\"784-256-128-10\",\"batch\":$batch,\"device\":\"cuda\",\"steps\":4000,\"samples_per_s\":$gpu_sps,\"test_acc\":$(num final_test_acc "$gpu"),\"baseline\":\"cpu_${JOBS}_threads\",\"ratio\":$ratio}"
  [[ "$gpu_sps" != null && "$cpu_sps" != null ]] || status=1
done

# Accuracy on the GPU: 10 epochs at batch 64 (the CPU reaches >= 0.88).
acc=$(run_train cuda 64 1 0 10)
a=$(num final_test_acc "$acc")
pass=$(awk -v a="$a" 'BEGIN{print (a != "null" && a >= 0.88) ? "true" : "false"}')
echo "JSON {\"check\":\"gpu_10_epochs_batch64\",\"test_acc\":$a,\"samples_per_s\":$(num samples_per_s "$acc"),\"pass\":$pass}"
[[ "$pass" == true ]] || status=1

log "done in $((SECONDS - START)) s, status $status"
exit $status
