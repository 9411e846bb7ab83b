#!/usr/bin/env bash
# Runs every uvm test: builds (installing missing tools first), runs the cpu and gpu suites, and
# prints "N passed, N failed, N skipped". GPU tests skip, with the reason, where there is no GPU.
# Extra arguments go to `meson test` (e.g. --suite cpu).
set -euo pipefail
cd "$(dirname "$0")/.."
export UVM_DEPS=tests
source scripts/build.sh
set +e
meson test -C "$build" --print-errorlogs "$@" >"$build/meson-test.out" 2>&1
set -e
grep -E '^ *[0-9]+/[0-9]+ ' "$build/meson-test.out" || cat "$build/meson-test.out"
python3 scripts/summarize_tests.py "$build/meson-logs/testlog.json"
