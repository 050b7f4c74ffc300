#!/usr/bin/env bash
# Builds asyncps and runs every test: the README's test command and what CI
# runs. Installs missing Debian packages first (needs root or sudo).
#
#   ./run_tests.sh            # Release build in build/, all ctest tests,
#                             # then the codec tests under ASan + UBSan
#   SKIP_SANITIZERS=1 ./run_tests.sh
set -euo pipefail
cd "$(dirname "$0")"
./install_deps.sh

BUILD=${BUILD_DIR:-build}
JOBS=${JOBS:-$(nproc)}
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release
cmake --build "$BUILD" -j"$JOBS"
# GPU tests skip themselves when no device is visible.
ctest --test-dir "$BUILD" --output-on-failure -j"$JOBS" --timeout 600

if [ "${SKIP_SANITIZERS:-0}" != 1 ]; then
  # Decoders of untrusted bytes (wire headers, codec payloads) under
  # AddressSanitizer + UndefinedBehaviorSanitizer.
  SAN="$BUILD-asan"
  cmake -S . -B "$SAN" -DCMAKE_BUILD_TYPE=Debug -DASYNCPS_ENABLE_CUDA=OFF \
    -DASYNCPS_SANITIZE=address,undefined
  cmake --build "$SAN" -j"$JOBS" --target compression_test common_test
  export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
  export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
  ctest --test-dir "$SAN" --output-on-failure -j"$JOBS" -R '^(Codec|Spec|TopK|Compressor|Corruption|Wire|Layout|Status)'
fi
