#!/usr/bin/env bash
# Megatron-Core on uvm, on one GPU: (1) tests/peers/megatron_on_uvm.py's parts, through its dynamic
# inference engine; (2) engine suspend/resume timed through uvm.memory_saver and through the real
# torch_memory_saver wheel, alternating, in this one run; (3) Megatron-LM's own suspend/resume tests
# (tests/peers/megatron_tests.py). Megatron-Core's 0.19.2 wheel and the peers' files come from
# .deps (scripts/fetch_peers.sh: Megatron-LM at f8837c04ef, torch_memory_saver 0.0.10), installed into
# scratch folders; nothing needs the network. Ends with "N passed, M failed, K blocked".
set -uo pipefail
cd "$(dirname "$0")/../.."
python=${UVM_PYTHON:-python3}
wheel=$(ls .deps/wheels/megatron_core-*.whl 2>/dev/null | head -n 1)
if [ -z "$wheel" ]; then
  echo "SKIP: no megatron-core wheel in .deps/wheels (bash scripts/fetch_peers.sh)"
  exit 77
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$python" -m pip install -q --no-deps --target "$work/site" "$wheel" $(ls .whl/einops-*.whl 2>/dev/null) || exit 1
peer_wheel=$(ls .deps/wheels/torch_memory_saver-*.whl 2>/dev/null | head -n 1)
[ -n "$peer_wheel" ] && "$python" -m pip install -q --no-deps --target "$work/peer" "$peer_wheel"
export PYTHONPATH="$PWD/python_shim:$work/site" PYTHONUNBUFFERED=1
passed=0 failed=0 blocked=0
count() {  # adds the numbers of a "N passed, M failed, K blocked" or pytest summary line
  local p f b
  read -r p f b < <(awk '{ for (i = 2; i <= NF; i++) { w = $i; gsub(/[^a-z]/, "", w); n = $(i - 1) + 0
      if (w == "passed") P += n; if (w == "failed" || w == "error" || w == "errors") F += n
      if (w == "blocked" || w == "skipped") B += n } } END { print P + 0, F + 0, B + 0 }' <<<"$1")
  passed=$((passed + p)) failed=$((failed + f)) blocked=$((blocked + b))
}

echo "== Megatron-Core's engine on uvm (tests/peers/megatron_on_uvm.py)"
"$python" tests/peers/megatron_on_uvm.py 2>&1 | tee "$work/parts.log" | grep -vE "Warning|warnings.warn|^\s*$"
line=$(grep -E '^[0-9]+ passed, [0-9]+ failed, [0-9]+ blocked$' "$work/parts.log" | tail -n 1)
[ -n "$line" ] && count "$line" || { echo "FAIL: the parts ended without a summary"; failed=$((failed + 1)); }

echo "== engine suspend/resume, uvm.memory_saver and torch_memory_saver ${peer_wheel##*/} alternating"
: >"$work/times.jsonl"
savers="uvm peer"
if [ -z "$peer_wheel" ]; then
  echo "BLOCKED timing beside the peer: no torch_memory_saver wheel in .deps/wheels (bash scripts/fetch_peers.sh)"
  blocked=$((blocked + 1)) savers=uvm
fi
for round in 1 2; do
  for saver in $savers; do
    site=""
    [ "$saver" = peer ] && site=":$work/peer"
    PYTHONPATH="$PYTHONPATH$site" MASTER_PORT=$((29600 + round * 2 + ${#saver})) "$python" tests/peers/megatron_on_uvm.py \
      --time "$saver" --gib "${MEGATRON_KV_GIB:-4}" >"$work/time.log" 2>&1
    if grep -q '^{"saver"' "$work/time.log"; then
      grep '^{"saver"' "$work/time.log" | tee -a "$work/times.jsonl"
    else
      echo "FAIL timing $saver (round $round):"; tail -n 20 "$work/time.log" | sed 's/^/    /'
      failed=$((failed + 1))
    fi
  done
done
[ -n "${OUT:-}" ] && cp "$work/times.jsonl" "$OUT/megatron_suspend.jsonl"
"$python" - "$work/times.jsonl" "$savers" <<'EOF' && passed=$((passed + 1)) || failed=$((failed + 1))
import json, statistics, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
savers = {r["saver"] for r in rows}
for saver in ("uvm", "peer"):
    mine = [r for r in rows if r["saver"] == saver]
    if not mine:
        continue
    gb = mine[0]["kv_bytes"] / 1e9
    s = [t for r in mine for t in r["suspend_s"]]
    w = [t for r in mine for t in r["resume_s"]]
    print(f"{saver:5s} KV {gb:.2f} GB: suspend median {statistics.median(s):.3f} s ({gb / statistics.median(s):.1f} GB/s), "
          f"resume median {statistics.median(w):.3f} s ({gb / statistics.median(w):.1f} GB/s), {len(s)} cycles")
if savers != set(sys.argv[2].split()):
    sys.exit(f"timing: measured {sorted(savers)}, asked for {sys.argv[2].split()}")
EOF

echo "== Megatron-LM's own suspend/resume tests ($(cat .deps/megatron-lm/COMMIT 2>/dev/null || echo 'not fetched'))"
if [ -f .deps/megatron-lm/tests/unit_tests/inference/engines/test_dynamic_engine.py ]; then
  WORLD_SIZE=1 LOCAL_RANK=0 MASTER_PORT=29650 "$python" tests/peers/megatron_tests.py .deps/megatron-lm \
    -k "test_suspend_resume_cycle or test_speculative_decoding_suspend_resume" 2>&1 | tee "$work/mlm.log" |
    grep -E "^(PASSED|FAILED|SKIPPED|ERROR)|passed|failed|error" | grep -v Warning
  # Only the tests that paused and resumed memory through uvm count (megatron_tests.py's last line);
  # the others pass on any saver, or none.
  line=$(grep -E '^=* ?[0-9]+ (passed|failed)' "$work/mlm.log" | tail -n 1)
  on_uvm=$(sed -nE 's/^on uvm: ([0-9]+) of [0-9]+ passed tests.*/\1/p' "$work/mlm.log" | tail -n 1)
  if [ -z "$line" ] || [ -z "$on_uvm" ]; then
    echo "FAIL: Megatron-LM's tests ended without a summary"; tail -n 30 "$work/mlm.log"; failed=$((failed + 1))
  elif [[ "$line" =~ failed|error ]] || [ "$on_uvm" -eq 0 ] || grep -q "^FAIL" "$work/mlm.log"; then
    echo "FAIL: Megatron-LM's tests: $line; $on_uvm of them on uvm"; failed=$((failed + 1))
  else
    passed=$((passed + on_uvm))
  fi
  [ -n "${OUT:-}" ] && cp "$work/mlm.log" "$OUT/megatron_lm_tests.log"
else
  echo "BLOCKED: Megatron-LM's tests are not in .deps/megatron-lm (bash scripts/fetch_peers.sh)"
  blocked=$((blocked + 1))
fi
[ -n "${OUT:-}" ] && cp "$work/parts.log" "$OUT/megatron_parts.log"
echo "$passed passed, $failed failed, $blocked blocked"
[ "$failed" = 0 ]
