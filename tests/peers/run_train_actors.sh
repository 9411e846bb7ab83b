#!/usr/bin/env bash
# The RL stacks' train actors started as each stack starts them (tests/peers/train_actors.py runs each
# stack's own lookup of the library to preload: slime's slime/ray/actor_group.py and AReaL's
# areal/utils/offload.py; NeMo-RL's Megatron worker preloads nothing, and its
# nemo_rl/models/megatron/memory_saver.py pauses its inference weights; at the commits in
# .deps/{slime,areal,nemo-rl}/COMMIT: scripts/fetch_peers.sh), on the real torch_memory_saver 0.0.10 (.deps/wheels, installed beside;
# UVM_SWITCH=0) and on uvm (UVM_SWITCH=1), in one call, with nothing of uvm's named to the actor.
#   run_train_actors.sh PYTHON   (a python with the uvm-cuda wheel and torch: scripts/device_wheel.sh's)
# Needs a GPU; results under $OUT. Ends with "N passed, M failed" (uvm's side: the original's results
# are printed beside, and a stack whose original fails is said, not counted).
set -uo pipefail
cd "$(dirname "$0")/../.."
python=${1:?a python with the uvm-cuda wheel installed}
out=${OUT:-$(mktemp -d)}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
tms_wheel=$(ls .deps/wheels/torch_memory_saver-*.whl 2>/dev/null | head -n 1)
if [ -z "$tms_wheel" ]; then
  echo "SKIP: torch_memory_saver's wheel (.deps/wheels) is not here (scripts/fetch_peers.sh)"
  exit 77
fi
"$python" -m pip install -q --no-deps --target "$work/real" "$tms_wheel" || { echo "FAIL: installing $tms_wheel"; exit 1; }
echo "the original: $(basename "$tms_wheel")"
passed=0 failed=0 ran=0
for stack in slime areal nemo-rl; do
  echo "$stack $(cat ".deps/$stack/COMMIT" 2>/dev/null || echo 'not fetched')"
  for side in original:0 uvm:1; do
    name=${side%%:*} switch=${side#*:}
    env -u UVM_PRELOAD_LIBUVM -u UVM_PRELOAD_CUDART PYTHONPATH="$work/real" UVM_SWITCH="$switch" PYTHONUNBUFFERED=1 \
      "$python" tests/peers/train_actors.py "$stack" "$out/${stack}_$name.json" >"$out/${stack}_$name.log" 2>&1
    status=$?
    echo "  $name (UVM_SWITCH=$switch): exit $status: $(grep -v "^$" "$out/${stack}_$name.log" | tail -n 1 | cut -c1-300)"
    [ "$status" -eq 77 ] && continue
    ran=$((ran + 1))
    [ "$name" = original ] && continue  # said above, beside uvm's
    if [ "$status" -eq 0 ]; then passed=$((passed + 1)); else failed=$((failed + 1)); fi
  done
done
[ "$ran" -eq 0 ] && { echo "SKIP: no stack's file is here (scripts/fetch_peers.sh)"; exit 77; }
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ] && [ "$passed" -gt 0 ]
