#!/usr/bin/env bash
# The multi-GPU checks (issue 5), for a machine with 2 or more GPUs; on fewer it says so and exits 77.
#   bash tests/multi_gpu/run.sh BUILD_DIR [OUT]
# 1. C: device 1's memory (managed, and releasable copied back by uvm's kernel) is allocated,
#    hinted, offloaded and onloaded without a context on device 0.
# 2. One process, one pool per device: allocations land on the pool's device, the current device is
#    kept, offload/onload of each device's tensors.
# 3. torchrun, 2 ranks: one shared compile cache (each library built once), a model per rank
#    offloaded and onloaded, NCCL all_reduce on pool tensors, both ranks moving at once vs one (a
#    bench row in OUT).
# 4. torchrun, 2 ranks, rank 1 cannot build: every rank raises the same error (sync_ranks=True).
set -uo pipefail
cd "$(dirname "$0")/../.."
build=${1:?usage: run.sh BUILD_DIR [OUT]}
OUT=${2:-${OUT:-$PWD/device-out}}
mkdir -p "$OUT"
# NVLink multicast stays off (a program using it can take a shared host's GPUs out of service).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
gpus=$(python3 -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null || echo 0)
if [ "$gpus" -lt 2 ]; then
  echo "SKIP: the multi-GPU checks need 2 GPUs; this machine has $gpus"
  exit 77
fi
export PYTHONPATH=$PWD/python_shim
passed=0 failed=0
check() {
  local name=$1; shift
  echo "== $name"
  if "$@"; then passed=$((passed + 1)); echo "PASS $name"; else failed=$((failed + 1)); echo "FAIL $name"; fi
}
# UVM_ONLOAD_COPY=sm: the releasable case must copy with uvm's kernel on device 1, never fall back.
check "no context on device 0 (C)" env UVM_ONLOAD_COPY=sm "$build/tests/gpu/gpu_tests" "[multi_gpu]"
check "one pool per device (python)" python3 tests/multi_gpu/pools_one_process.py
cache=$(mktemp -d)
check "torchrun: shared cache, offload, NCCL all_reduce, bench row" \
  env UVM_CACHE_DIR="$cache" UVM_BENCH_OUT="$OUT" torchrun --standalone --nproc-per-node 2 tests/multi_gpu/distributed.py
check "torchrun: one rank fails to build, every rank raises the same error" \
  env UVM_CACHE_DIR="$(mktemp -d)" torchrun --standalone --nproc-per-node 2 tests/multi_gpu/distributed.py --fail-rank 1
rm -rf "$cache"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
