#!/usr/bin/env bash
# Runs the GPU suite (or the tests a second argument picks) under compute-sanitizer memcheck; any
# error fails the test. Skips (77) with the
# reason when there is no GPU or no compute-sanitizer.
set -u
suite=$1
sanitizer=$(command -v compute-sanitizer || true)
for dir in "${CUDA_HOME:-}" "${CUDA_PATH:-}" /usr/local/cuda; do
  [ -z "$sanitizer" ] && [ -n "$dir" ] && [ -x "$dir/bin/compute-sanitizer" ] && sanitizer=$dir/bin/compute-sanitizer
done
"$suite" --list-test-names-only >/dev/null 2>&1
if [ $? -eq 77 ]; then "$suite"; exit 77; fi  # prints its own reason: no GPU
if [ -z "$sanitizer" ]; then echo "SKIP: compute-sanitizer not found"; exit 77; fi
# memcheck also reports failed API calls. One test provokes one on purpose — uvm's capture probe on
# the legacy stream (cudaErrorStreamCaptureImplicit, cleared at once) — so it runs outside memcheck,
# in the plain gpu test, which checks that no error is left pending; so does the compressed pause
# and resume with the device full (the coder's scratch allocation fails, and they go on without it).
# A second argument picks the tests instead (e.g. "[release]" under UVM_ONLOAD_COPY=sm).
exec "$sanitizer" --tool memcheck --leak-check no --error-exitcode 99 "$suite" "${2:-~[api_error_probe]~[multi_gpu]}"
