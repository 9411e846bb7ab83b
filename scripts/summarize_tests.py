"""Turns meson's test log into one count of test cases: Catch2 programs count their test cases,
other tests count as one. Prints each test's result, the reason of every skip and the output of
every failure, then 'N passed, N failed, N skipped'. Exits 1 if anything failed or nothing ran."""
import json
import os
import re
import sys

CATCH_ALL_PASSED = re.compile(r"All tests passed \(\d+ assertions? in (\d+) test cases?\)")
CATCH_TOTALS = re.compile(r"^test cases:\s*(\d+)(.*)$", re.MULTILINE)
MODEL_SEQUENCES = re.compile(r"^model: (\d+) sequences", re.MULTILINE)
# Every word pytest's closing line may hold ("250 passed, 12 skipped, 3 warnings in 100.20s"): a
# word left out made the line unread, and the whole suite one case with its skips lost.
PYTEST_TOTALS = re.compile(r"^=*\s*((?:\d+ (?:passed|failed|skipped|errors?|xfailed|xpassed|deselected|warnings?|"
                           r"rerun)(?:, )?)+) in [\d.]+s", re.MULTILINE)


def counts(stdout):
    """(passed, failed, skipped) from a Catch2 or pytest summary, or None if there is none."""
    match = PYTEST_TOTALS.search(stdout)
    if match:
        parts = dict((label, int(n)) for n, label in re.findall(r"(\d+) (\w+)", match.group(1)))
        return (parts.get("passed", 0), parts.get("failed", 0) + parts.get("errors", 0) + parts.get("error", 0),
                parts.get("skipped", 0))
    match = CATCH_ALL_PASSED.search(stdout)
    if match:
        return int(match.group(1)), 0, 0
    match = CATCH_TOTALS.search(stdout)
    if not match:
        return None
    parts = dict((label, int(n)) for n, label in re.findall(r"(\d+) (passed|failed|skipped)", match.group(2)))
    return parts.get("passed", 0), parts.get("failed", 0), parts.get("skipped", 0)


def main(path, extra=()):
    """`extra`: result files of checks run beside meson's tests (scripts/mutants.py --result), each a
    line of JSON with name, passed, failed and summary: their counts join the total."""
    passed = failed = skipped = model_sequences = 0
    with open(path) as log:
        results = [json.loads(line) for line in log if line.strip()]
    for result in results:
        name = result["name"]
        status = result["result"]
        stdout = result.get("stdout") or ""
        if status == "SKIP":
            reason = next((l for l in stdout.splitlines() if l.startswith("SKIP")), "no reason printed")
            print(f"{name}: skipped — {reason}")
            skipped += 1
            continue
        p, f, s = counts(stdout) or ((1, 0, 0) if status == "OK" else (0, 1, 0))
        if status != "OK" and f == 0:
            f = 1  # a crash or timeout after its cases passed still fails the program
        passed, failed, skipped = passed + p, failed + f, skipped + s
        sequences = sum(int(n) for n in MODEL_SEQUENCES.findall(stdout))
        model_note = f", {sequences} random sequences of the stateful model" if sequences else ""
        print(f"{name}: {status} ({p} passed, {f} failed{model_note})")
        model_sequences += sequences
        if status != "OK":
            print("  " + "\n  ".join(stdout.strip().splitlines()[-40:]))
    if model_sequences:
        print(f"stateful model: {model_sequences} random sequences, every tensor's bytes kept")
    for extra_path in extra:
        with open(extra_path) as result_file:
            result = json.loads(result_file.read())
        print(f"{result['name']}: {result['summary']}")
        passed, failed = passed + result["passed"], failed + result["failed"]
    distinct = os.environ.get("UVM_DISTINCT_CASES", "").strip()
    print("counted per run: a Catch2 case that several builds (plain, ASan, TSan, CUDA 12 headers) or tag "
          "selections run counts once in each" + (f"; the programs hold {distinct} distinct Catch2 cases" if distinct else ""))
    print(f"{passed} passed, {failed} failed, {skipped} skipped")
    return 1 if failed or passed == 0 else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2:]))
