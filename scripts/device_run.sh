#!/usr/bin/env bash
# Everything a GPU machine run needs, in one call: environment facts, build, every suite (cpu, gpu
# with compute-sanitizer), the demo, and the offload benchmark. Logs and results go to $OUT (or
# ./device-out). Arguments go to `meson test`. Env:
#   BENCH=full|quick|sweep|none  full (default): every size and method; quick: 4 GiB only; sweep:
#                                quick, then onload pipeline settings (SWEEP, chunk MiB:streams)
#   BENCH_ARGS="..."             replaces the offload bench's size arguments (split on spaces)
#   TRACE_SMALL=1                traces a cycle of the small-tensor model (UVM_TRACE) to $OUT,
#                                moved by TRACE_METHOD (default "uvm auto")
#   TESTS=0                      skips the tests (else also the GPU suite built against CUDA 12.8,
#                                when .deps/cuda-12.8 is there: scripts/fetch_cuda12.sh)
#   MULTI_GPU=1                  runs tests/multi_gpu/run.sh (2+ GPUs)
#   PROBE=1                      runs bench/probes/transfer_probe.cu with PROBE_ARGS (default "4096 2")
#   PINNED_PROBE="4 8 [first|wall|overlap|registrars]"  runs bench/probes/pinned_probe.cpp with those arguments
#                                (several runs: separated by ';', each into pinned_probe-K.txt)
#   GATHER_PROBE="4096 [--before DIR]"  runs bench/probes/gather_probe.py (the shim's per-tensor costs)
#   RELEASE_PROBE=1              runs bench/probes/first_release_probe.py (what makes a sleep's first release wait)
#   JIT_BENCH=1                  runs the JIT build benchmark
#   STREAM_BENCH=1               runs the streaming benchmark (python -m uvm bench stream) with
#                                STREAM_ARGS (default: 12 GiB of layers, a 4 GiB budget)
#   LIFETIME_BENCH=1             runs bench/lifetime_bench.py (what learning of a block's death costs)
#   CLAIM_PROBE=1                runs bench/probes/claim_probe.py (host→device copies right after a giant free)
#   MAP_PROBE=1                  runs bench/probes/map_threads_probe.cu: fresh device memory mapped by 1, 2 or 4
#                                threads, alone and beside copies, on GPU 0 alone and every GPU at once
#   PAGEABLE_BENCH=1             the offload bench at 4 GiB, staged, with UVM_PINNED=pageable and
#                                registered, alternating, two rounds
#   NODE_BENCH=1                 runs bench/node_bench.py: every GPU pausing and resuming at once, and GPU 0
#                                alone, beside torch_memory_saver and the pinned memcpy ceiling
#                                (NODE_ARGS: more arguments, e.g. "--gib 4 --cycles 3")
#   NODE_TRACE=1                 runs the node bench again with UVM_TRACE (NODE_TRACE_ARGS; default: 4 GPUs or
#                                all there are, then 1, 3 cycles, uvm.memory_saver plain and compressed)
#                                and prints each pause and resume phase by phase (bench/probes/pause_phases.py)
#   CODEC_BENCH=1                runs bench/codec_bench.cpp (built with the tests): compressed backups against
#                                plain copies, every GPU at once and GPU 0 alone (CODEC_GIB per GPU, default 4),
#                                once for each kind of data CODEC_DATA names (default "bf16"; also fp16 fp32
#                                int8 fp8 random), each into codec/results-KIND.json
#   SLABS_BENCH=1                the offload bench's small-tensor model (2 GiB of 512 KiB tensors),
#                                staged and as a pool, with UVM_SLABS=0 and 1, alternating, two rounds
#   PEERS=1                      runs torch_memory_saver's examples on uvm.memory_saver
#                                (tests/peers/run_tms_examples.sh) and the Megatron-Core harness
#   PRELOAD=1                    hook mode "preload": tests/python/test_preload*.py, torch_memory_saver's
#                                own test file on the original and on uvm (tests/peers/run_tms_tests.sh),
#                                SGLang's adapter in both modes (tests/peers/run_sglang_adapter.sh)
#   BACKUP_BENCH=1               runs bench/backup_bench.py (BACKUP_DIR, BACKUP_GIB, BACKUP_THREADS,
#                                BACKUP_ARGS: more arguments, e.g. "--no-disk --rounds 2" or
#                                "--ram-disk 12 --disk-only --disk-rounds 4": a RAM-backed loop disk)
#   SOAK=1                       runs bench/soak_bench.py: SOAK_CYCLES (default 500) sleep/wake cycles
#                                through uvm.memory_saver, SOAK_MIB (default 128) MiB per region
#   TESTS_BEFORE="DIR tests"     runs this tree's pytest tests (file::name ...) against the older tree in DIR
#                                (an older commit's files, e.g. from `git archive`): a fix's tests must fail there
#   POOLS_BEFORE=DIR             runs tests/python/test_pools_gpu.py against the older tree in DIR too
#                                (it must fail there: the pools it checks kept their memory)
#   RL_BENCH=1                   runs the sleep/wake cycle benchmark (python -m uvm bench rl);
#                                RL_ALSO="VAR=x;VAR=y" runs it again with each environment;
#                                RL_TRACE=1 writes each child's UVM_TRACE into $OUT/rl-traces.tar.gz
#                                and each wake's floor (bench/probes/wake_floor.py) into $OUT/rl/floors.txt;
#                                RL_BEFORE=DIR runs it with the uvm tree in DIR (an older commit's files,
#                                e.g. from `git archive`) and with this tree, alternating, two rounds
#                                (instead of the single run)
#   WHEEL=1                      the wheel as users install it, no compiler or toolkit on PATH
#                                (scripts/device_wheel.sh; the wheel travels in .deps/dist); with
#                                SWITCHED=1 also the peers moved onto it by its switch
#                                (tests/peers/run_switched.sh); with SLIME=1 slime's train actor as slime
#                                starts it, AReaL's and NeMo-RL's too (tests/peers/run_train_actors.sh: .deps/slime, .deps/areal, .deps/nemo-rl, .deps/wheels)
#   CUDA12=VERSION               builds the library and the GPU suite against CUDA VERSION's headers
#                                (.deps/cuda-VERSION) and runs that suite on its libcudart.so.12
#   BUILD=0                      no meson build, no meson tests, no demo (python-only runs: the
#                                shim builds the library itself)
#   NCCL_PAUSE=1                 runs tests/multi_gpu/run_nccl_pause.sh (2 GPUs): collectives on pausable memory
#                                across pause and resume, uvm beside torch_memory_saver (.deps/tmsonly: carry it)
#   WEIGHT_SYNC=1                runs tests/peers/run_weight_sync.sh: a trainer's weights sent to an engine
#                                (SGLang's adapter, both hook modes) through CUDA IPC, tokens against a reference
#   VLLM=1                       runs tests/peers/run_vllm_tests.sh: vLLM's own allocator tests on vLLM's allocator
#                                and on uvm's, test by test (.deps/vllm: scripts/fetch_vllm.sh; .deps/dist: the
#                                wheel); with VLLM_BENCH=1 also `uvm bench vllm` there (VLLM_BENCH_ARGS)
#   PYTEST="files"               runs those pytest files (e.g. the Python GPU tests one change needs)
#   BEFORE=DIR                   also benchmarks the uvm tree in DIR (an older commit's files,
#                                e.g. from `git archive`), alternating before/after runs of
#                                BEFORE_ARGS (default: 1 and 4 GiB, auto, staged and pinned memcpy;
#                                split as the shell splits words, so quotes group); BEFORE_ALSO="VAR=x"
#                                adds a run of this tree with that environment to each round
# The device has no network: Catch2 travels as Debian's .deb in .deps/ (carry it), unpacked to /tmp.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/device-out}
mkdir -p "$OUT"
# The versions a probe's text output is read with (the benchmarks' JSON records its own).
versions() {
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
}
exec > >(tee "$OUT/device_run.log") 2>&1

echo "== environment"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
nvcc --version | tail -n 2
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)' 2>/dev/null || echo "torch: not importable"
meson --version

# Python packages the device lacks travel as wheels in .whl/ (hypothesis, for test_model_gpu.py).
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl &&
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi

if [ ! -f /usr/include/catch2/catch.hpp ] && ls .deps/catch2_*.deb >/dev/null 2>&1; then
  rm -rf /tmp/c2 && dpkg -x .deps/catch2_*.deb /tmp/c2
  # The package's .pc names /usr/include: point it at the unpacked copy (no sysroot, so that the
  # nested CUDA 12 builds and the pkg-config example see pkg-config as a user would).
  sed -i 's|^includedir=/usr/include|includedir=/tmp/c2/usr/include|' /tmp/c2/usr/share/pkgconfig/catch2.pc
  export PKG_CONFIG_PATH=/tmp/c2/usr/share/pkgconfig
fi

build=build-device
if [ "${BUILD:-1}" = 1 ]; then
  rm -rf "$build"
  # The sanitizer runs are CI's (they test the fake runtime, which is the same here).
  meson setup "$build" -Dsanitizers=false >"$OUT/setup.log" 2>&1 || { cat "$OUT/setup.log"; exit 1; }
  ninja -C "$build" >"$OUT/build.log" 2>&1 || { tail -n 60 "$OUT/build.log"; exit 1; }
else
  TESTS=0
  mkdir -p "$build"
fi

# Runs `meson test` in build dir $1 (further arguments go to it); the log goes to $OUT/testlog$2.txt
# and the summary line is printed. Returns the summary's status.
run_suite() {
  local dir=$1 tag=$2
  shift 2
  meson test -C "$dir" --print-errorlogs "$@" >"$dir/meson-test.out" 2>&1
  grep -E '^ *[0-9]+/[0-9]+ ' "$dir/meson-test.out"
  cp "$dir/meson-logs/testlog.txt" "$OUT/testlog$tag.txt"
  python3 scripts/summarize_tests.py "$dir/meson-logs/testlog.json"
}

status=0
if [ "${TESTS:-1}" = 1 ]; then
  echo "== tests"
  run_suite "$build" "" "$@" | tee "$OUT/summary.txt"
  status=${PIPESTATUS[0]}
  # The GPU suite once more, built against CUDA 12.8 headers and run on libcudart.so.12 (the cpu
  # test cuda-12.8-headers made that build): the CUDA 12 fallbacks on a real driver.
  if [ -f "$build/cuda-12.8/build.ninja" ]; then
    echo "== gpu suite built against CUDA 12.8"
    run_suite "$build/cuda-12.8" -cuda12 --suite gpu || status=1
  fi
fi

if [ "${WHEEL:-0}" = 1 ]; then
  echo "== the wheel, installed as users install it"
  bash scripts/device_wheel.sh "$OUT" || status=1
fi

if [ -n "${CUDA12:-}" ]; then
  echo "== the GPU suite built against CUDA $CUDA12 headers, on its libcudart.so.12"
  bash tests/cuda12/build_against.sh "$PWD" "$PWD/$build" "$CUDA12" --build-only >"$OUT/cuda12-build.log" 2>&1
  tail -n 3 "$OUT/cuda12-build.log"
  run_suite "$build/cuda-$CUDA12" "-cuda$CUDA12" --suite gpu || status=1
fi

if [ "${MULTI_GPU:-0}" = 1 ]; then
  echo "== multi-GPU"
  bash tests/multi_gpu/run.sh "$build" "$OUT" 2>&1 | tee "$OUT/multi_gpu.log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
fi

if [ "${PEERS:-0}" = 1 ]; then
  echo "== torch_memory_saver's examples on uvm.memory_saver"
  bash tests/peers/run_tms_examples.sh 2>&1 | tee "$OUT/tms_examples.log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  if [ -f tests/peers/megatron_on_uvm.py ]; then
    echo "== Megatron-Core on uvm"
    bash tests/peers/run_megatron.sh 2>&1 | tee "$OUT/megatron.log"
    [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  fi
fi

if [ "${PRELOAD:-0}" = 1 ]; then
  echo "== preload mode: uvm's tests"
  python3 -m pytest tests/python/test_preload.py tests/python/test_preload_gpu.py -v -rs -p no:cacheprovider 2>&1 |
    tee "$OUT/preload_tests.log" | grep -E "PASSED|FAILED|SKIPPED|ERROR|passed|failed"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  echo "== preload mode: torch_memory_saver's test_examples.py, the original and uvm"
  bash tests/peers/run_tms_tests.sh 2>&1 | tee "$OUT/tms_tests.txt"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  echo "== preload mode: SGLang's adapter"
  bash tests/peers/run_sglang_adapter.sh 2>&1 | tee "$OUT/sglang_adapter.txt"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
fi

if [ "${NCCL_PAUSE:-0}" = 1 ]; then
  echo "== NCCL across pause and resume (2 GPUs)"
  bash tests/multi_gpu/run_nccl_pause.sh "$OUT" 2>&1 | tee "$OUT/nccl_pause.txt"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
fi

if [ "${WEIGHT_SYNC:-0}" = 1 ]; then
  echo "== trainer→engine weight update through CUDA IPC, SGLang's adapter in both hook modes"
  bash tests/peers/run_weight_sync.sh 2>&1 | tee "$OUT/weight_sync.txt"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
fi

if [ "${VLLM:-0}" = 1 ]; then
  echo "== vLLM's allocator tests, on vLLM's allocator and on uvm's"
  bash tests/peers/run_vllm_tests.sh 2>&1 | tee "$OUT/vllm_tests.txt"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
fi

if [ -n "${PYTEST:-}" ]; then
  echo "== pytest $PYTEST"
  PYTHONPATH=$PWD/python_shim${PYTHONPATH:+:$PYTHONPATH} python3 -m pytest $PYTEST -q -rs -p no:cacheprovider \
    --junitxml "$OUT/pytest.xml" 2>&1 | tee "$OUT/pytest.log" | grep -E "^(FAILED|ERROR|SKIPPED)|passed|failed"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
fi

if [ "${BUILD:-1}" = 1 ]; then
  echo "== demo"
  "$build/uvm_demo"
fi

echo "== doctor"
PYTHONPATH=python_shim python3 -m uvm doctor

if [ "${PROBE:-0}" = 1 ]; then
  echo "== transfer probe"
  mkdir -p "$build"
  nvcc -O2 -std=c++17 -arch=native -o "$build/transfer_probe" bench/probes/transfer_probe.cu &&
    { versions; echo "transfer_probe ${PROBE_ARGS:-4096 2}"; "$build/transfer_probe" ${PROBE_ARGS:-4096 2}; } | tee "$OUT/probe.txt"
fi

if [ "${JIT_BENCH:-0}" = 1 ]; then
  echo "== JIT build bench"
  PYTHONPATH=python_shim python3 bench/jit_bench.py
fi

if [ "${STREAM_BENCH:-0}" = 1 ]; then
  echo "== streaming bench"
  PYTHONPATH=python_shim python3 -m uvm bench stream ${STREAM_ARGS:-} --json "$OUT/stream.json" | tee "$OUT/stream.txt" || status=1
fi

if [ "${LIFETIME_BENCH:-0}" = 1 ]; then
  echo "== block lifetime bench"
  PYTHONPATH=python_shim python3 bench/lifetime_bench.py --json "$OUT/lifetime.json" | tee "$OUT/lifetime.txt" || status=1
fi

if [ "${CLAIM_PROBE:-0}" = 1 ]; then
  echo "== claim probe"
  { versions; python3 bench/probes/claim_probe.py; } | tee "$OUT/claim_probe.txt" || status=1
fi

if [ "${MAP_PROBE:-0}" = 1 ]; then
  echo "== map threads probe (GPU 0 alone, then every GPU at once)"
  mkdir -p "$build"
  if nvcc -O2 -std=c++17 -o "$build/map_threads_probe" bench/probes/map_threads_probe.cu -lcuda; then
    gpus=$(nvidia-smi -L | wc -l)
    {
      versions
      "$build/map_threads_probe" 0
      echo "-- all $gpus GPUs at once"
      for ((g = 0; g < gpus; g++)); do "$build/map_threads_probe" "$g" >"$OUT/map_threads-$g.txt" & done
      wait
      cat "$OUT"/map_threads-*.txt
    } | tee "$OUT/map_threads_probe.txt" || status=1
  else
    status=1
  fi
fi

if [ "${PAGEABLE_BENCH:-0}" = 1 ]; then
  for round in 1 2; do
    for pinned in pageable registered; do
      echo "== offload bench, UVM_PINNED=$pinned, round $round"
      UVM_PINNED=$([ $pinned = pageable ] && echo pageable) PYTHONPATH=python_shim python3 -m uvm bench \
        --sizes-mib 4096 --small-mib 0 --methods "uvm staged" --out "$OUT/pinned-$pinned-$round" || status=1
    done
  done
fi

if [ "${NODE_BENCH:-0}" = 1 ]; then
  echo "== node bench (bench/node_bench.py ${NODE_ARGS:-})"
  if ls .deps/wheels/torch_memory_saver-*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-deps --target /tmp/peer-site .deps/wheels/torch_memory_saver-*.whl
  fi
  # shellcheck disable=SC2086  # NODE_ARGS is the bench's arguments, split as words
  PYTHONPATH=python_shim:/tmp/peer-site python3 bench/node_bench.py --out "$OUT/node" ${NODE_ARGS:-} || status=1
fi

if [ "${NODE_TRACE:-0}" = 1 ]; then
  echo "== node bench traced (UVM_TRACE; bench/probes/pause_phases.py)"
  mkdir -p "$OUT/node-traces"
  methods="uvm memory_saver,uvm memory_saver (compressed)"
  # shellcheck disable=SC2086  # NODE_TRACE_ARGS is the bench's arguments, split as words
  UVM_TRACE="$OUT/node-traces/uvm-%p.json" PYTHONPATH=python_shim python3 bench/node_bench.py \
    --out "$OUT/node-traced" --cycles 3 --methods "$methods" ${NODE_TRACE_ARGS:-} || status=1
  python3 bench/probes/pause_phases.py "$OUT/node-traces" >"$OUT/node-traces/phases.txt" || status=1
  cat "$OUT/node-traces/phases.txt"
fi

if [ "${CODEC_BENCH:-0}" = 1 ]; then
  echo "== codec bench (bench/codec_bench.cpp, ${CODEC_GIB:-4} GiB per GPU)"
  mkdir -p "$OUT/codec"
  versions >"$OUT/codec/versions.txt"
  for data in ${CODEC_DATA:-bf16}; do
    "$build/bench/codec_bench" --gib "${CODEC_GIB:-4}" --data "$data" --out "$OUT/codec/results-$data.json" || status=1
  done
fi

if [ "${SLABS_BENCH:-0}" = 1 ]; then
  for round in 1 2; do
    for slabs in 0 1; do
      echo "== offload bench, small tensors, UVM_SLABS=$slabs, round $round"
      UVM_SLABS=$slabs PYTHONPATH=python_shim python3 -m uvm bench --sizes-mib "" --small-mib 2048 \
        --methods "uvm staged,uvm pool" --out "$OUT/slabs-$slabs-$round" || status=1
    done
  done
fi

if [ -n "${PINNED_PROBE:-}" ]; then
  echo "== pinned memory probe ($PINNED_PROBE)"
  mkdir -p "$build"
  if g++ -O2 -std=c++17 bench/probes/pinned_probe.cpp -I"${CUDA_HOME:-/usr/local/cuda}/include" \
       -L"${CUDA_HOME:-/usr/local/cuda}/lib64" -lcudart -lpthread -o "$build/pinned_probe"; then
    IFS=';' read -r -a specs <<<"$PINNED_PROBE"
    k=0
    for spec in "${specs[@]}"; do
      k=$((k + 1))
      # shellcheck disable=SC2086  # a spec is the probe's arguments, split as words
      { versions; echo "pinned_probe $spec"; "$build/pinned_probe" $spec; } | tee "$OUT/pinned_probe-$k.txt" || status=1
    done
  else
    status=1
  fi
fi

if [ -n "${GATHER_PROBE:-}" ]; then
  echo "== gather probe ($GATHER_PROBE)"
  python3 bench/probes/gather_probe.py $GATHER_PROBE --json "$OUT/gather_probe.json" | tee "$OUT/gather_probe.txt" || status=1
fi

if [ "${BACKUP_BENCH:-0}" = 1 ]; then
  echo "== pause/resume by backup kind (pinned, mmap, disk) beside torch_memory_saver and the disk"
  if ls .deps/wheels/torch_memory_saver-*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-deps --target /tmp/peer-site .deps/wheels/torch_memory_saver-*.whl
  fi
  PYTHONPATH=python_shim:/tmp/peer-site python3 bench/backup_bench.py --dir "${BACKUP_DIR:-/var/tmp/uvm-backup-bench}" \
    --gib "${BACKUP_GIB:-4}" --threads "${BACKUP_THREADS:-auto}" ${BACKUP_ARGS:-} --json "$OUT/backup.json" | tee "$OUT/backup.txt" || status=1
fi

if [ "${SOAK:-0}" = 1 ]; then
  echo "== soak: ${SOAK_CYCLES:-500} sleep/wake cycles through uvm.memory_saver"
  python3 bench/soak_bench.py --cycles "${SOAK_CYCLES:-500}" --weights-mib "${SOAK_MIB:-128}" \
    --dir "${SOAK_DIR:-/var/tmp/uvm-soak}" --out "$OUT/soak" | tee "$OUT/soak.txt"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
fi

if [ -n "${TESTS_BEFORE:-}" ]; then
  # TESTS_BEFORE="DIR file::test ..." runs this tree's versions of those tests (their files and
  # conftest.py copied over) against the older tree in DIR: a fix's new tests must fail there.
  read -r before_dir before_tests <<<"$TESTS_BEFORE"
  echo "== this tree's tests against the tree in $before_dir (they must fail there): $before_tests"
  mkdir -p "$before_dir/tests/python"
  cp tests/python/*.py "$before_dir/tests/python/"
  (cd "$before_dir" && UVM_TEST_FROM_TREE=1 UVM_CACHE_DIR=/tmp/uvm-cache-before python3 -m pytest $before_tests -v \
    -p no:cacheprovider 2>&1 | tee "$OUT/tests_before.log" | grep -E "PASSED|FAILED|ERROR|passed|failed" | cut -c1-240 | head -n 40)
fi

if [ -n "${POOLS_BEFORE:-}" ]; then
  echo "== the pool tests against the tree in $POOLS_BEFORE (they must fail there)"
  mkdir -p "$POOLS_BEFORE/tests/python"
  cp tests/python/test_pools_gpu.py tests/python/conftest.py "$POOLS_BEFORE/tests/python/"
  (cd "$POOLS_BEFORE" && UVM_CACHE_DIR=/tmp/uvm-cache-before python3 -m pytest tests/python/test_pools_gpu.py -q \
    -p no:cacheprovider 2>&1 | grep -E "^(FAILED|ERROR|E  +AssertionError)|passed|failed" | cut -c1-220 | head -n 20)
fi

if [ "${RL_BENCH:-0}" = 1 ] || [ "${RELEASE_PROBE:-0}" = 1 ]; then
  if ls .deps/wheels/torch_memory_saver-*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-deps --target /tmp/peer-site .deps/wheels/torch_memory_saver-*.whl
  fi
fi

if [ "${RELEASE_PROBE:-0}" = 1 ]; then
  echo "== what makes a sleep's first release wait (bench/probes/first_release_probe.py)"
  PYTHONPATH=python_shim:/tmp/peer-site python3 bench/probes/first_release_probe.py | tee "$OUT/first_release_probe.txt" || status=1
fi

if [ "${RL_BENCH:-0}" = 1 ]; then
  echo "== RL sleep/wake cycle bench"
  eval "rl_args=(${RL_ARGS:-})"  # split as the shell splits words, so quotes group (method names have spaces)
  rl_trace=()
  [ "${RL_TRACE:-0}" = 1 ] && mkdir -p /tmp/rl-traces && rl_trace=(env UVM_TRACE=/tmp/rl-traces/rl-%p.json)
  if [ -z "${RL_BEFORE:-}" ]; then  # with RL_BEFORE, its rounds of this tree are the run
    "${rl_trace[@]}" env PYTHONPATH=python_shim:/tmp/peer-site python3 -m uvm bench rl "${rl_args[@]}" --out "$OUT/rl" || status=1
  fi
  if [ "${RL_TRACE:-0}" = 1 ]; then
    tar -czf "$OUT/rl-traces.tar.gz" -C /tmp rl-traces
    echo "== the floors under each traced wake and the sleep calls' releases (bench/probes/wake_floor.py)"
    python3 bench/probes/wake_floor.py "$OUT/rl/results.json" /tmp/rl-traces | tee "$OUT/rl/floors.txt" || status=1
  fi
  IFS=';' read -r -a rl_also <<<"${RL_ALSO:-}"
  for i in "${!rl_also[@]}"; do
    echo "== RL sleep/wake cycle bench again, with ${rl_also[$i]}"
    env ${rl_also[$i]} PYTHONPATH=python_shim:/tmp/peer-site python3 -m uvm bench rl "${rl_args[@]}" \
      --out "$OUT/rl-also-$i" || status=1
  done
  if [ -n "${RL_BEFORE:-}" ]; then
    for round in 1 2; do
      for side in before after; do
        root=$PWD
        [ "$side" = before ] && root=$RL_BEFORE
        echo "== RL sleep/wake cycle bench, $side ($root), round $round"
        UVM_CACHE_DIR=/tmp/uvm-cache-$side PYTHONPATH=$root/python_shim:/tmp/peer-site \
          python3 -m uvm bench rl "${rl_args[@]}" --out "$OUT/rl-$side-$round" || status=1
      done
    done
  fi
fi

if [ -n "${BEFORE:-}" ]; then
  echo "== offload bench: before ($BEFORE) and after (this tree), alternating"
  before_args=(--sizes-mib 1024,4096 --methods "uvm auto,uvm staged,pinned memcpy")
  [ -n "${BEFORE_ARGS:-}" ] && eval "before_args=($BEFORE_ARGS)"
  for round in 1 2; do
    for side in before after; do
      root=$PWD
      [ "$side" = before ] && root=$BEFORE
      UVM_CACHE_DIR=/tmp/uvm-cache-$side PYTHONPATH=$root/python_shim \
        python3 -m uvm bench "${before_args[@]}" --out "$OUT/bench-$side-$round" >"$OUT/bench-$side-$round.log" 2>&1 ||
        { tail -n 20 "$OUT/bench-$side-$round.log"; status=1; }
      echo "-- $side, round $round"
      grep -E "^\| *[0-9]" "$OUT/bench-$side-$round.log"
      [ -n "${BEFORE_ALSO:-}" ] && [ "$side" = after ] && {
        echo "-- after with $BEFORE_ALSO, round $round"
        env $BEFORE_ALSO UVM_CACHE_DIR=/tmp/uvm-cache-after PYTHONPATH=$PWD/python_shim python3 -m uvm bench \
          "${before_args[@]}" --out "$OUT/bench-also-$round" 2>/dev/null | grep -E "^\| *[0-9]"
      }
    done
  done
fi

bench=${BENCH:-full}
if [ "$bench" != none ]; then
  echo "== offload bench"
  sizes=()
  [ "$bench" != full ] && sizes=(--sizes-mib 4096)
  [ -n "${BENCH_ARGS:-}" ] && read -r -a sizes <<<"$BENCH_ARGS"
  PYTHONPATH=python_shim python3 -m uvm bench "${sizes[@]}" --out "$OUT/bench" || status=1
fi
if [ "${TRACE_SMALL:-0}" = 1 ]; then
  echo "== trace of the small-tensor model's cycles (${TRACE_METHOD:-uvm auto})"
  UVM_TRACE=$OUT/trace-small.json PYTHONPATH=python_shim python3 -m uvm bench --sizes-mib "" --small-mib 2048 \
    --methods "${TRACE_METHOD:-uvm auto}" --cycles 1 --out "$OUT/trace-small" 2>/dev/null | grep -E "^\| 2048" || status=1
fi
if [ "$bench" = sweep ]; then
  for setting in ${SWEEP:-32:2 128:2 32:4 64:4 16:8}; do
    echo "== onload pipeline ${setting%%:*} MiB x ${setting##*:} streams"
    UVM_ONLOAD_CHUNK_MIB=${setting%%:*} UVM_ONLOAD_STREAMS=${setting##*:} PYTHONPATH=python_shim \
      python3 -m uvm bench --sizes-mib 4096 --methods "uvm staged,pinned memcpy" --out "$OUT/sweep-$setting" 2>/dev/null |
      grep -E "^\| 4096|staged at|pinned memcpy at"
  done
fi
exit "$status"
