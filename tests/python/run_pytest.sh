#!/usr/bin/env bash
# Runs the shim's pytest suite; skips (77) with the reason if pytest is missing. pytest's "no tests
# ran" (exit 5) counts as a failure.
cd "$1" || exit 1
if ! python3 -m pytest --version >/dev/null 2>&1; then echo "SKIP: pytest is not installed"; exit 77; fi
python3 -m pytest tests/python -q -rs -p no:cacheprovider
status=$?
[ "$status" -eq 5 ] && { echo "FAIL: pytest collected no tests"; exit 1; }
exit "$status"
