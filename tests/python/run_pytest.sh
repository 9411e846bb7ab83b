#!/usr/bin/env bash
# Runs the shim's pytest suite with $UVM_PYTHON (scripts/test.sh sets it to uvm's own virtualenv;
# default python3); skips (77) with the reason if pytest is missing there. pytest's "no tests ran"
# (exit 5) counts as a failure.
cd "$1" || exit 1
python=${UVM_PYTHON:-python3}
if ! "$python" -m pytest --version >/dev/null 2>&1; then echo "SKIP: pytest is not installed for $python"; exit 77; fi
echo "python: $("$python" -c 'import sys; print(sys.executable, sys.version.split()[0])')"
"$python" -m pytest tests/python -q -rs -p no:cacheprovider
status=$?
[ "$status" -eq 5 ] && { echo "FAIL: pytest collected no tests"; exit 1; }
exit "$status"
