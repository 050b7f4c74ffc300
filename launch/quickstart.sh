#!/usr/bin/env bash
# asyncps quickstart: dependencies, Release build, then 2 shards + 4 workers on
# Fashion-MNIST (SSP s=2; top-k 1% with error feedback when the worker accepts
# that codec, else uncompressed) for a few epochs, with a progress display.
#
#   ./launch/quickstart.sh [extra psrun options] [-- extra worker flags]
#
# Environment: BUILD (build folder, default <repo>/build), EPOCHS (default 3),
# RUN_DIR (default <repo>/runs/quickstart-<time>), SKIP_DEPS=1 (no apt).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${BUILD:-$REPO/build}"
EPOCHS="${EPOCHS:-3}"
RUN_DIR="${RUN_DIR:-$REPO/runs/quickstart-$(date -u +%Y%m%d-%H%M%S)}"
JOBS="$(nproc 2>/dev/null || echo 2)"
T0=$(date +%s)

step() { printf '\n== %s (%ds)\n' "$1" "$(( $(date +%s) - T0 ))"; }

if [ "${SKIP_DEPS:-0}" != 1 ]; then
  step "dependencies"
  "$REPO/install_deps.sh"
fi

step "build (Release, ps_server ps_worker ps_ctl) in $BUILD"
if [ ! -f "$BUILD/CMakeCache.txt" ]; then
  cmake -S "$REPO" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release >"$BUILD.configure.log" 2>&1 || {
    cat "$BUILD.configure.log"; exit 1; }
elif ! grep -q '^CMAKE_BUILD_TYPE:STRING=Release$' "$BUILD/CMakeCache.txt"; then
  echo "note: $BUILD is configured as $(grep '^CMAKE_BUILD_TYPE' "$BUILD/CMakeCache.txt" | cut -d= -f2); switching it to Release"
  cmake -S "$REPO" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release >/dev/null
fi
cmake --build "$BUILD" --target ps_server ps_worker ps_ctl -j"$JOBS" 2>&1 |
  grep -E '^\[ *[0-9]+%\] (Built target|Linking)|error|Error' || true
for b in ps_server ps_worker ps_ctl; do
  [ -x "$BUILD/bin/$b" ] || { echo "quickstart: $BUILD/bin/$b was not built" >&2; exit 1; }
done

# Top-k 1% with error feedback if this ps_worker knows the codec. Its flags are
# validated before any data is read or server contacted, so a bogus data dir
# makes it stop right after the codec check.
CONFIG="$REPO/launch/configs/fashion_topk.flags"
probe="$(timeout 20 "$BUILD/bin/ps_worker" --servers=tcp://127.0.0.1:1 \
          --codec=topk:ratio=0.01,ef=1 --data_dir=/nonexistent --max_steps=1 2>&1 || true)"
if printf '%s' "$probe" | grep -qiE -- "ps_worker failed:.*codec|unknown command line flag 'codec'"; then
  echo "note: ps_worker does not accept --codec=topk:ratio=0.01,ef=1; running uncompressed"
  CONFIG="$REPO/launch/configs/fashion_ssp.flags"
fi

step "training: 2 shards + 4 workers, $(basename "$CONFIG"), $EPOCHS epoch(s)"
set +e
"$REPO/launch/psrun" --config "$CONFIG" --servers 2 --workers 4 --bin_dir "$BUILD/bin" \
  --run_dir "$RUN_DIR" --progress on "$@" -- --epochs="$EPOCHS"
rc=$?
set -e
step "done"
if [ $rc -eq 0 ]; then
  python3 - "$RUN_DIR/summary.json" <<'PY'
import json, sys
t = json.load(open(sys.argv[1]))["totals"]
cr = t["compression_ratio"]
print("final test accuracy: %.4f" % t["final_test_acc"])
print("compression ratio:   %s" % ("%.1fx (pushed bytes raw / on the wire)" % cr if cr else "n/a"))
PY
fi
echo "run folder:          $RUN_DIR (logs, metrics-<rank>.csv, summary.json)"
echo "total time:          $(( $(date +%s) - T0 )) s"
exit $rc
