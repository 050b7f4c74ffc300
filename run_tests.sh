#!/usr/bin/env bash
# Builds asyncps and runs every test: the README's test command and what CI
# runs. Installs missing Debian packages first, the SSH and Slurm test beds
# included (needs root or sudo). After each ctest stage it prints how many
# tests were skipped and why (tests/ctest_skips.py).
#
#   ./run_tests.sh            # Release build in build/, all ctest tests,
#                             # then unit + server integration tests under
#                             # ASan + UBSan and server/client tests under TSan
#   SKIP_SANITIZERS=1 ./run_tests.sh
set -euo pipefail
cd "$(dirname "$0")"
./install_deps.sh --test-beds

# ctest_stage NAME DIR [CTEST ARGS...]: ctest on DIR, then its skip report
# (ctest's summary line stays as it is); returns ctest's exit status. Output
# of passed tests is kept whole so that their `SKIP:` lines reach the report.
ctest_stage() {
  local stage=$1 dir=$2 rc=0
  shift 2
  rm -f "$dir/ctest-junit.xml"
  ctest --test-dir "$dir" --output-junit ctest-junit.xml \
    --test-output-size-passed 262144 "$@" || rc=$?
  /usr/bin/python3 tests/ctest_skips.py "$stage" "$dir/ctest-junit.xml" || true
  return "$rc"
}

# configure DIR [CMAKE ARGS...]: Ninja for a new tree where it is installed
# (install_deps.sh installs it): it compiles a target's sources as soon as
# their own inputs exist, where make first finishes every target it depends
# on, leaving a core idle at each library's last compile and archive. A tree
# configured before keeps its generator (cmake refuses to change it).
configure() {
  local dir=$1 gen=()
  shift
  if [ ! -f "$dir/CMakeCache.txt" ] && command -v ninja >/dev/null; then
    gen=(-G Ninja)
  fi
  cmake -S . -B "$dir" "${gen[@]}" "$@"
}

BUILD=${BUILD_DIR:-build}
JOBS=${JOBS:-$(nproc)}
SECONDS=0
configure "$BUILD" -DCMAKE_BUILD_TYPE=Release
cmake --build "$BUILD" -j"$JOBS"
echo "run_tests: Release build took ${SECONDS} s"
SECONDS=0
# GPU tests skip themselves (GTEST_SKIP, reported Skipped) when no device is
# visible; launch.ssh and launch.slurm_real run real fleets on the test beds.
# Every stage runs even when one before it failed (each failure is named at
# the end, and the exit status is non-zero).
FAILED_STAGES=()
ctest_stage Release "$BUILD" --output-on-failure -j"$JOBS" --timeout 600 || FAILED_STAGES+=(Release)
echo "run_tests: Release tests took ${SECONDS} s"

# Every C++ source formatted by .clang-format (clang-format --dry-run -Werror).
SECONDS=0
rc=0
/usr/bin/python3 tests/static/format_check.py || rc=$?
[ "$rc" -eq 0 ] || [ "$rc" -eq 77 ] || FAILED_STAGES+=(clang-format)
echo "run_tests: clang-format stage took ${SECONDS} s"

# Clang's thread-safety analysis over every file that uses asyncps::Mutex
# (common/mutex.h), with the Release tree's compile commands.
SECONDS=0
rc=0
/usr/bin/python3 tests/static/thread_safety.py "$BUILD" -j"$JOBS" || rc=$?
[ "$rc" -eq 0 ] || [ "$rc" -eq 77 ] || FAILED_STAGES+=(thread-safety)
echo "run_tests: thread-safety stage took ${SECONDS} s"

if [ "${SKIP_SANITIZERS:-0}" != 1 ]; then
  # AddressSanitizer + UndefinedBehaviorSanitizer: the unit tests of common,
  # compression, server and the worker client, plus the server's
  # multi-process tests (hostile requests included) and the short network
  # fuzz tests (malformed bytes; well-formed hostile values beside a real
  # worker) against an ASan ps_server. ThreadSanitizer: server_test and client_test.
  SECONDS=0
  SAN="$BUILD-asan"
  configure "$SAN" -DCMAKE_BUILD_TYPE=Debug -DASYNCPS_ENABLE_CUDA=OFF \
    -DASYNCPS_SANITIZE=address,undefined
  # The test executables and binaries below, in one build run (CMakeLists.txt).
  cmake --build "$SAN" -j"$JOBS" --target asyncps_asan_targets
  export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
  export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
  # The structure-aware fuzz (hostile values) against the ASan shard, short.
  ASYNCPS_HOSTILE_FUZZ_MESSAGES=4000 \
  ctest_stage ASan+UBSan "$SAN" --output-on-failure -j"$JOBS" --timeout 300 \
    -R '^(Codec|Spec|TopK|Compressor|Corruption|Wire|Layout|Status|Transport|Server|Shard|Optimizer|Staleness|BadInput|WorkerClocks|Client|NetFuzz|PushDedup|ShutdownWatchdog|Hostile|AdminAddress|Sparse|FlatIndex|RowCache|RowsPlan|Store|LrSchedule|DelayCompensation|ShmSegment|SharedMemory|ElasticDoc|Rebalance|Migrate|RowsMigrate|KeyRanges|EtcdClientTransport|EtcdClientOptions|ReplicaLayout|ReplicaMac|ReplicatorTest)' || FAILED_STAGES+=(ASan+UBSan)
  echo "run_tests: ASan+UBSan stage took ${SECONDS} s"

fi
if [ "${SKIP_SANITIZERS:-0}" != 1 ]; then
  # ThreadSanitizer: the server's event loop and the client's threads, and
  # replica groups (the membership thread beside the event loop). The
  # hand-over of bytes through (uninstrumented) libzmq is annotated in
  # common/transport.cc; tests/tsan.supp silences reports inside libzmq.
  SECONDS=0
  TSAN="$BUILD-tsan"
  configure "$TSAN" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DASYNCPS_ENABLE_CUDA=OFF \
    -DASYNCPS_SANITIZE=thread
  cmake --build "$TSAN" -j"$JOBS" --target asyncps_tsan_targets
  TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 suppressions=$PWD/tests/tsan.supp" \
    ctest_stage TSan "$TSAN" --output-on-failure -j"$JOBS" --timeout 300 \
    -R '^(Server|Shard|Optimizer|Staleness|BadInput|WorkerClocks|Client|PushDedup|ShutdownWatchdog|Sparse|RowCache|RowsPlan|Store|LrSchedule|DelayCompensation|Replica|Replication|EtcdClient|ElasticServer)' || FAILED_STAGES+=(TSan)
  echo "run_tests: TSan stage took ${SECONDS} s"
fi
if [ ${#FAILED_STAGES[@]} -gt 0 ]; then
  echo "run_tests: FAILED stages: ${FAILED_STAGES[*]}"
  exit 1
fi
echo "run_tests: every stage passed"
