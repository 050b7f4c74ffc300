#!/usr/bin/env bash
# The full network fuzz run: a real ps_server receives MESSAGES (default
# 1,000,000) malformed requests, must stay up, answer each, and keep its
# state bitwise (tests/fuzz/net_fuzz_test.cc with a bigger count).
#   tests/fuzz/net_fuzz.sh [BUILD_DIR] [MESSAGES] [SEED]
set -euo pipefail
BUILD=${1:-build}
export ASYNCPS_NET_FUZZ_MESSAGES=${2:-1000000}
export ASYNCPS_NET_FUZZ_SEED=${3:-1}
exec "$BUILD/bin/net_fuzz_test" --gtest_filter='NetFuzzTest.*'
