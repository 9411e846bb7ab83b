#!/usr/bin/env bash
# Runs the shim's pytest suite against what users install: scripts/test_wheel.sh builds the sdist
# from this tree and the wheel from the sdist (or takes $UVM_TEST_WHEEL) and installs it into a
# fresh virtualenv, whose python then runs the tests (UVM_TEST_INSTALLED=1: nothing is imported from
# python_shim/). $UVM_PYTHON (scripts/test.sh sets it to uvm's own virtualenv; default python3)
# builds; where it has torch, the virtualenv sees that torch too. UVM_TEST_FROM_TREE=1 tests the
# source tree with $UVM_PYTHON instead (faster, for development). Skips (77) with the reason if
# pytest is missing, except in CI (CI set), where a missing tool is a failure: the whole Python suite
# could otherwise skip with CI green. pytest's "no tests ran" (exit 5) counts as a failure.
cd "$1" || exit 1
python=${UVM_PYTHON:-python3}
if ! "$python" -m pytest --version >/dev/null 2>&1; then
  if [ -n "${CI:-}" ]; then echo "FAIL: pytest is not installed for $python, and CI runs every suite"; exit 1; fi
  echo "SKIP: pytest is not installed for $python"
  exit 77
fi
if [ "${UVM_TEST_FROM_TREE:-0}" = 1 ]; then
  echo "testing the source tree (UVM_TEST_FROM_TREE=1)"
  runner=$python
else
  torch_site=$("$python" -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))' 2>/dev/null)
  built=$(UVM_WHEEL_SITE=$torch_site bash scripts/test_wheel.sh | tail -n 1) || { echo "FAIL: building or installing the wheel"; exit 1; }
  read -r wheel runner <<<"$built"
  echo "testing the installed wheel: $wheel"
  export UVM_TEST_INSTALLED=1 UVM_TEST_WHEEL=$wheel
fi
echo "python: $("$runner" -c 'import sys; print(sys.executable, sys.version.split()[0])')"
"$runner" -m pytest tests/python -q -rs -p no:cacheprovider
status=$?
[ "$status" -eq 5 ] && { echo "FAIL: pytest collected no tests"; exit 1; }
exit "$status"
