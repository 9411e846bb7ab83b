#!/usr/bin/env bash
# NCCL across pause and resume (tests/multi_gpu/nccl_pause.py says what runs), 2 ranks under
# torchrun: uvm.memory_saver regions (and their tag registered with NCCL through uvm.nccl, which on one node
# registers nothing), a uvm releasable pool registered with NCCL through uvm.nccl
# (and, observed only, one registered anyway and one registered behind uvm's back), and
# torch_memory_saver's regions beside them (its wheel in .deps/tmsonly, installed to a temporary
# folder), each compared checksum by checksum with the run on torch's own memory. A hang ends at
# `timeout` (and the process group's own 90 s). Results under $OUT (nccl_pause-*.json.rank*).
#   bash tests/multi_gpu/run_nccl_pause.sh [OUT]
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:-${OUT:-$PWD/device-out}}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1  # multicast stays off
gpus=$(python3 -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null || echo 0)
if [ "$gpus" -lt 2 ]; then
  echo "SKIP: NCCL across pause needs 2 GPUs; this machine has $gpus"
  exit 77
fi
tms=$(mktemp -d)
wheel=$(ls .deps/tmsonly/torch_memory_saver-*.whl 2>/dev/null | head -n 1)
[ -n "$wheel" ] && python3 -m pip install -q --no-deps --target "$tms" "$wheel"
memories="plain uvm-region uvm-region-registered uvm-pool uvm-pool-forced uvm-pool-unhooked"
[ -n "$wheel" ] && memories="$memories tms-region" || echo "NOTE: no torch_memory_saver wheel in .deps/tmsonly: the original is not run"
for memory in $memories; do
  echo "== $memory"
  PYTHONPATH=$PWD/python_shim:$tms${PYTHONPATH:+:$PYTHONPATH} timeout 240 \
    torchrun --standalone --nproc-per-node 2 tests/multi_gpu/nccl_pause.py "$memory" "$OUT/nccl_pause-$memory.json" \
    >"$OUT/nccl_pause-$memory.log" 2>&1
  echo "exit $?"
  tail -n 5 "$OUT/nccl_pause-$memory.log"
done
python3 - "$OUT" $memories <<'PY'
import json, sys
out, memories = sys.argv[1], sys.argv[2:]
def load(memory):
    try:
        return [json.load(open(f"{out}/nccl_pause-{memory}.json.rank{rank}")) for rank in (0, 1)]
    except (OSError, ValueError) as error:
        return f"no result ({error}): see nccl_pause-{memory}.log"
reference = load("plain")
passed = failed = 0
for memory in memories[1:]:
    run, problems = load(memory), []
    if isinstance(reference, str) or isinstance(run, str):
        problems.append(reference if isinstance(reference, str) else run)
    else:
        for rank in (0, 1):
            for number, (got, wanted) in enumerate(zip(run[rank]["steps"], reference[rank]["steps"])):
                differ = [name for name in wanted if name not in ("freed_bytes", "input_kept") and got[name] != wanted[name]]
                if differ:
                    problems.append(f"rank {rank} step {number}: {', '.join(differ)} differ from the plain run")
                if number and not got["input_kept"]:
                    problems.append(f"rank {rank} step {number}: the input's bytes were not kept across the pause")
                if number and got["freed_bytes"] < 7 * 64 * 2**20 * 0.9:
                    problems.append(f"rank {rank} step {number}: the pause freed {got['freed_bytes']} bytes")
    ok = not problems
    if memory in ("uvm-pool-unhooked", "uvm-pool-forced"):  # observed, not required: NCCL's own behaviour
        print(f"nccl across pause, {memory} (observed, not counted): {'same results' if ok else '; '.join(problems[:6])}")
        continue
    passed += ok
    failed += not ok
    versions = "" if isinstance(run, str) else f" (NCCL {run[0]['nccl']}, torch {run[0]['torch']}, {run[0]['device']})"
    print(f"nccl across pause, {memory}: {'PASS' if ok else 'FAIL: ' + '; '.join(problems[:6])}{versions}")
print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
PY
