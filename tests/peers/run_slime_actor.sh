#!/usr/bin/env bash
# slime's Megatron train actor started as slime starts it (tests/peers/slime_actor.py runs slime's own
# lookup of the library to preload, from slime/ray/actor_group.py at the commit in .deps/slime/COMMIT:
# scripts/fetch_peers.sh), on the real torch_memory_saver 0.0.10 (.deps/wheels, installed beside;
# UVM_SWITCH=0) and on uvm (UVM_SWITCH=1), in one call, with nothing of uvm's named to the actor.
#   run_slime_actor.sh PYTHON   (a python with the uvm-cuda wheel and torch: scripts/device_wheel.sh's)
# Needs a GPU; results under $OUT. Ends with "N passed, M failed".
set -uo pipefail
cd "$(dirname "$0")/../.."
python=${1:?a python with the uvm-cuda wheel installed}
out=${OUT:-$(mktemp -d)}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
tms_wheel=$(ls .deps/wheels/torch_memory_saver-*.whl 2>/dev/null | head -n 1)
if [ ! -f .deps/slime/slime/ray/actor_group.py ] || [ -z "$tms_wheel" ]; then
  echo "SKIP: slime's actor_group.py (.deps/slime) or torch_memory_saver's wheel (.deps/wheels) is not here (scripts/fetch_peers.sh)"
  exit 77
fi
"$python" -m pip install -q --no-deps --target "$work/real" "$tms_wheel" || { echo "FAIL: installing $tms_wheel"; exit 1; }
echo "slime $(cat .deps/slime/COMMIT); the original: $(basename "$tms_wheel")"
passed=0 failed=0
for side in original:0 uvm:1; do
  name=${side%%:*} switch=${side#*:}
  env -u UVM_PRELOAD_LIBUVM -u UVM_PRELOAD_CUDART PYTHONPATH="$work/real" UVM_SWITCH="$switch" PYTHONUNBUFFERED=1 \
    "$python" tests/peers/slime_actor.py "$out/slime_$name.json" >"$out/slime_$name.log" 2>&1
  status=$?
  echo "  $name (UVM_SWITCH=$switch): exit $status: $(tail -n 1 "$out/slime_$name.log" | cut -c1-300)"
  if [ "$status" -eq 0 ]; then passed=$((passed + 1)); else failed=$((failed + 1)); fi
done
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
