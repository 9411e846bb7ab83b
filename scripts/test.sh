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
cp "$build/meson-logs/testlog.json" "$build/suite-testlog.json"  # what is summarized, whatever runs next
# The mutation check, after the tests (it changes sources and rebuilds): a quarter of the mutants
# each day, so that four days run them all; every mutant is checked to still apply on every run.
# Each killed mutant counts as a passed case; a survivor, a stale or broken one, and one whose run failed
# without a test failing (not a kill) as a failed one.
# UVM_MUTANTS=0 leaves it out; UVM_MUTANTS=all runs every mutant.
extra=()
if [ "${UVM_MUTANTS:-today}" != 0 ] && [ $# -eq 0 ]; then
  shard=(--shard today/4)
  [ "${UVM_MUTANTS:-}" = all ] && shard=()
  echo "== mutation check (scripts/mutants.py ${shard[*]})"
  python3 scripts/mutants.py --build "$build" "${shard[@]}" --result "$build/mutants.json" | tee "$build/mutants.out" |
    grep -E "^(SURVIVED|STALE|BROKEN|NOT A KILL|room|mutants)" || true
  extra=("$build/mutants.json")
fi
# The total counts each run: a Catch2 case that several builds (plain, ASan, TSan, CUDA 12 headers)
# or tag selections run counts once per run. How many distinct cases the programs hold, beside it:
UVM_DISTINCT_CASES=$(for program in "$build"/tests/{alloc,hints,offload}_tests "$build"/tests/preload/preload_tests; do
  # Catch2 2.x exits with the number of cases it listed: not a failure here.
  [ ! -x "$program" ] || "$program" --list-test-names-only 2>/dev/null || true
done | grep -v '^$' | sort -u | wc -l) || UVM_DISTINCT_CASES=
export UVM_DISTINCT_CASES
python3 scripts/summarize_tests.py "$build/suite-testlog.json" "${extra[@]}"
