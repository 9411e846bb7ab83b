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

# One pinned file of a stack's repository into .deps/NAME, with its commit: fetch_file NAME REPO COMMIT PATH WHY
fetch_file() {
  local name=$1 repo=$2 commit=$3 path=$4 why=$5
  if [ -d "$repo" ]; then
    rm -rf ".deps/$name" && mkdir -p ".deps/$name"
    git -C "$repo" archive "$commit" "$path" | tar -x -C ".deps/$name"
    echo "$commit" >".deps/$name/COMMIT"
    echo "$name's $(basename "$path") at $commit"
  else
    echo "$name mirror $repo is not here: $why is not refreshed (a clone with $commit)"
  fi
}
fetch_file slime "$slime_repo" 624b824a898ab0ec1fcb4d373004c7f3852bf515 slime/ray/actor_group.py "its actor code (SLIME_REPO)"
fetch_file areal "$areal_repo" 4aef98d8d818af55b43621aaadba047ae10f4e77 areal/utils/offload.py "its offload module (AREAL_REPO)"
fetch_file nemo-rl "$nemo_rl_repo" 7ea279abfbeb698b092856d0dab61e7cf39bc909 nemo_rl/models/megatron/memory_saver.py \
  "its memory_saver module (NEMO_RL_REPO)"

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
