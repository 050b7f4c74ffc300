#!/usr/bin/env bash
# make_fuzz_seeds: --help prints usage (exit 0) and a mistyped flag is an
# error (exit 2); neither creates a folder named after it. A folder argument
# gets the seeds.
set -euo pipefail
bin="$1"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cd "$dir"
"$bin" --help | grep -q "usage: make_fuzz_seeds OUT_DIR"
if "$bin" --bogus 2>/dev/null; then echo "--bogus accepted"; exit 1; fi
rc=0; "$bin" --bogus 2>/dev/null || rc=$?
[ "$rc" -eq 2 ] || { echo "--bogus: exit $rc, want 2"; exit 1; }
[ ! -e ./--help ] && [ ! -e ./--bogus ] || { echo "flag taken as a folder"; ls -la; exit 1; }
"$bin" seeds >/dev/null
[ -n "$(ls seeds/wire)" ] && [ -n "$(ls seeds/codecs)" ]
echo "make_fuzz_seeds CLI ok"
