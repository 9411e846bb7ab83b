#!/usr/bin/env bash
# Puts the peers' code that tests/peers runs into .deps/ (ignored by git; it travels to the GPU
# machine, which has no network): never into the repository. Pinned:
#   torch_memory_saver   github.com/fzyzcjy/torch_memory_saver at 4a43c97 (test/examples -> .deps/tms_examples;
#                        test/ with its test_examples.py -> .deps/tms_test) and its 0.0.10 wheel from PyPI
#                        (.deps/wheels)
#   SGLang               github.com/sgl-project/sglang at 1373e4f547: python/sglang/srt/utils/
#                        torch_memory_saver_adapter.py -> .deps/sglang (SGLANG_REPO: a clone with that
#                        commit; the tool library's read_file of that path at that commit gives the same bytes)
#   Megatron-LM          github.com/NVIDIA/Megatron-LM at f8837c04ef (head of core_r0.19.0, whose
#                        megatron/core/inference is byte-identical to the 0.19.2 wheel's): the engine
#                        tests and their helpers -> .deps/megatron-lm; megatron-core 0.19.2 wheel (cp312)
#   slime                github.com/THUDM/slime at 624b824a89: slime/ray/actor_group.py -> .deps/slime (its train
#                        actors' lookup of the library to preload: tests/peers/train_actors.py runs it)
#   AReaL                github.com/inclusionAI/AReaL at 4aef98d8d8: areal/utils/offload.py -> .deps/areal (its
#                        training workers' lookup, and the saver it pauses: tests/peers/train_actors.py)
#   NeMo-RL              github.com/NVIDIA-NeMo/RL at 7ea279abfb: nemo_rl/models/megatron/memory_saver.py ->
#                        .deps/nemo-rl (its Megatron worker's inference weights: tests/peers/train_actors.py)
#   Catch2               Debian's catch2 .deb (.deps), hypothesis and einops wheels (.whl)
# The repositories come from local git mirrors (TMS_REPO, MEGATRON_REPO, SLIME_REPO, AREAL_REPO, NEMO_RL_REPO: any clone that has the pinned
# commits; defaults are where the tool library's `fetch` puts them). Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."
tms_repo=${TMS_REPO:-/work/.mirror/fzyzcjy+torch_memory_saver/repo}
slime_repo=${SLIME_REPO:-/work/.mirror/THUDM+slime/repo}
areal_repo=${AREAL_REPO:-/work/.mirror/inclusionAI+AReaL/repo}
nemo_rl_repo=${NEMO_RL_REPO:-/work/.mirror/NVIDIA-NeMo+RL/repo}
megatron_repo=${MEGATRON_REPO:-/work/.mirror/NVIDIA+Megatron-LM/repo}
tms_commit=4a43c97
megatron_commit=f8837c04ef
mkdir -p .deps/wheels .whl

rm -rf .deps/tms_examples && mkdir -p .deps/tms_examples
git -C "$tms_repo" archive "$tms_commit" test/examples | tar -x -C .deps/tms_examples --strip-components=2
echo "torch_memory_saver examples at $tms_commit: $(ls .deps/tms_examples | tr '\n' ' ')"
rm -rf .deps/tms_test && mkdir -p .deps/tms_test
git -C "$tms_repo" archive "$tms_commit" test | tar -x -C .deps/tms_test --strip-components=1
echo "$tms_commit" >.deps/tms_test/COMMIT
echo "torch_memory_saver tests at $tms_commit: $(ls .deps/tms_test | tr '\n' ' ')"

sglang_commit=1373e4f547e8f2d715257def999e556398272757
adapter=python/sglang/srt/utils/torch_memory_saver_adapter.py
if [ -n "${SGLANG_REPO:-}" ]; then
  mkdir -p .deps/sglang && git -C "$SGLANG_REPO" show "$sglang_commit:$adapter" >.deps/sglang/torch_memory_saver_adapter.py
fi
if [ -f .deps/sglang/torch_memory_saver_adapter.py ]; then
  echo "$sglang_commit $adapter" >.deps/sglang/COMMIT
  echo "SGLang's adapter at $sglang_commit: $(sha256sum .deps/sglang/torch_memory_saver_adapter.py | cut -c1-16)"
else
  echo "SGLang's adapter is not here: set SGLANG_REPO to a clone with $sglang_commit"
fi

slime_commit=624b824a898ab0ec1fcb4d373004c7f3852bf515
if [ -d "$slime_repo" ]; then
  rm -rf .deps/slime && mkdir -p .deps/slime
  git -C "$slime_repo" archive "$slime_commit" slime/ray/actor_group.py | tar -x -C .deps/slime
  echo "$slime_commit" >.deps/slime/COMMIT
  echo "slime's actor_group.py at $slime_commit"
else
  echo "slime mirror $slime_repo is not here: its actor code is not refreshed (SLIME_REPO: a clone with $slime_commit)"
fi

areal_commit=4aef98d8d818af55b43621aaadba047ae10f4e77
if [ -d "$areal_repo" ]; then
  rm -rf .deps/areal && mkdir -p .deps/areal
  git -C "$areal_repo" archive "$areal_commit" areal/utils/offload.py | tar -x -C .deps/areal
  echo "$areal_commit" >.deps/areal/COMMIT
  echo "AReaL's offload.py at $areal_commit"
else
  echo "AReaL mirror $areal_repo is not here: its offload module is not refreshed (AREAL_REPO: a clone with $areal_commit)"
fi

nemo_rl_commit=7ea279abfbeb698b092856d0dab61e7cf39bc909
if [ -d "$nemo_rl_repo" ]; then
  rm -rf .deps/nemo-rl && mkdir -p .deps/nemo-rl
  git -C "$nemo_rl_repo" archive "$nemo_rl_commit" nemo_rl/models/megatron/memory_saver.py | tar -x -C .deps/nemo-rl
  echo "$nemo_rl_commit" >.deps/nemo-rl/COMMIT
  echo "NeMo-RL's memory_saver.py at $nemo_rl_commit"
else
  echo "NeMo-RL mirror $nemo_rl_repo is not here: its memory_saver module is not refreshed (NEMO_RL_REPO: a clone with $nemo_rl_commit)"
fi

if [ ! -d "$megatron_repo" ]; then
  echo "Megatron-LM mirror $megatron_repo is not here: its tests are not refreshed"
else
rm -rf .deps/megatron-lm && mkdir -p .deps/megatron-lm
git -C "$megatron_repo" archive "$megatron_commit" tests/__init__.py tests/unit_tests/__init__.py \
  tests/unit_tests/test_utilities.py tests/unit_tests/inference/__init__.py \
  tests/unit_tests/inference/engines/__init__.py tests/unit_tests/inference/engines/test_dynamic_engine.py |
  tar -x -C .deps/megatron-lm
echo "$megatron_commit" >.deps/megatron-lm/COMMIT
echo "Megatron-LM tests at $megatron_commit"
fi

python3 -m pip download -q --python-version 3.12 --only-binary=:all: --no-deps -d .deps/wheels \
  torch_memory_saver==0.0.10 megatron-core==0.19.2
python3 -m pip download -q --python-version 3.12 --only-binary=:all: --no-deps -d .whl \
  hypothesis sortedcontainers attrs einops
[ -f .deps/catch2_*.deb ] 2>/dev/null || (cd .deps && apt-get download catch2)
ls .deps/wheels .whl
