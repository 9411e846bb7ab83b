#!/usr/bin/env bash
# Runs the threaded and paced-pinning tests ROUNDS times (default 50) with PER_CPU processes per CPU
# at once (default 4), so that their threads interleave as on a loaded CI host; prints each failure's
# output and "N runs, N failed". Needs a build with tests (scripts/test.sh).
#   bash scripts/stress.sh [BUILD_DIR]      ROUNDS=50 PER_CPU=4
set -uo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
rounds=${ROUNDS:-50}
jobs=$(( $(nproc) * ${PER_CPU:-4} ))
out=$(mktemp -d)
runs=()
for round in $(seq "$rounds"); do
  for room in alloc hints offload; do runs+=("$room [threads]~[model]"); done
  runs+=("offload [steps]~[model]")
done
run_one() {  # "room filter" index
  local room=${1%% *} filter=${1#* } log="$out/$2.log"
  local pinned=hostalloc
  [[ $filter == *steps* ]] && pinned=
  if ! UVM_LIMIT_BYTES= UVM_LIMIT_FRACTION= UVM_DEFAULT_ADVICE= UVM_PINNED=$pinned \
      "$build/tests/${room}_tests" "$filter" >"$log" 2>&1; then
    echo "FAILED: $room $filter (run $2)"; tail -n 30 "$log"
    return 1
  fi
}
export -f run_one
export build out
printf '%s\n' "${runs[@]}" | nl -w1 -s' ' | xargs -P "$jobs" -I{} bash -c 'line="{}"; run_one "${line#* }" "${line%% *}"'
failed=$(grep -L "All tests passed" "$out"/*.log | wc -l)
echo "${#runs[@]} runs, $failed failed ($jobs at once on $(nproc) CPUs)"
rm -rf "$out"
[ "$failed" -eq 0 ]
