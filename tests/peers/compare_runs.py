"""Compares two pytest runs of the same test files test by test (their --junitxml reports): the
original's and uvm's. Prints each test's outcome on both, and fails (exit 1) on any test that passed
on the original but not on uvm, or that ran on one and not the other; and when the comparison could
be green for nothing: no test in either report, a collection error (an "error" outcome) on either
side, or an original that passed no test (uvm failing the same would look alike). A test that passes
on uvm and not on the original is shown, not failed.

    python3 compare_runs.py ORIGINAL.xml UVM.xml [--excused "file.py::test=why" ...]

An excused test (one that reaches into the original's internals, say) may pass on the original and
not on uvm: shown with its reason, not failed. An excuse that is not needed (the test passes on uvm,
or is in neither report) fails, so that the list cannot outlive its reasons.
"""
import sys
import xml.etree.ElementTree as ElementTree


def outcomes(path: str) -> dict[str, str]:
    """{file::test: passed | failed | skipped | error} from a junit report."""
    found = {}
    for case in ElementTree.parse(path).getroot().iter("testcase"):
        name = f"{case.get('classname', '').split('.')[-1]}.py::{case.get('name')}"
        kinds = {child.tag for child in case}
        found[name] = ("error" if "error" in kinds else "failed" if "failure" in kinds
                       else "skipped" if "skipped" in kinds else "passed")
    return found


def main(original_path: str, uvm_path: str, excused: dict[str, str] | None = None) -> int:
    original, uvm = outcomes(original_path), outcomes(uvm_path)
    excused = dict(excused or {})
    worse, unneeded = [], []
    for name in excused:
        if name not in original and name not in uvm or uvm.get(name) == "passed":
            unneeded.append(name)
            print(f"FAIL: the excuse for {name} is not needed (uvm: {uvm.get(name, 'absent')})")
    for name in sorted(set(original) | set(uvm)):
        before, after = original.get(name, "absent"), uvm.get(name, "absent")
        mark = ""
        if name in excused and before == "passed" and after != "passed":
            mark = f"  (excused: {excused[name]})"
        elif before == "passed" and after != "passed" or "absent" in (before, after):
            worse.append(name)
            mark = "  <- worse on uvm" if before == "passed" else "  <- not run on both"
        elif after == "passed" and before != "passed":
            mark = "  (passes on uvm only)"
        print(f"{name}: original {before}, uvm {after}{mark}")
    same = sum(1 for name in original if original[name] == uvm.get(name))
    print(f"compared {len(set(original) | set(uvm))} tests: {same} alike, {len(worse)} worse on uvm or not run on both; "
          f"passed: original {sum(v == 'passed' for v in original.values())}, uvm {sum(v == 'passed' for v in uvm.values())}")
    empty = [why for why in (
        "no test in either report" if not original and not uvm else "",
        "the original passed no test" if original and "passed" not in original.values() else "",
        "a test errored (collection?) on "
        + " and ".join(side for side, run in (("the original", original), ("uvm", uvm)) if "error" in run.values())
        if "error" in original.values() or "error" in uvm.values() else "") if why]
    for why in empty:
        print(f"FAIL: the comparison could pass for nothing: {why}")
    return 1 if worse or empty or unneeded else 0


def _excuses(arguments: list[str]) -> dict[str, str]:
    found = {}
    for flag, value in zip(arguments[::2], arguments[1::2]):
        if flag != "--excused" or "=" not in value:
            raise SystemExit(f"compare_runs.py: expected --excused file.py::test=why, not {flag} {value}")
        name, why = value.split("=", 1)
        found[name] = why
    if len(arguments) % 2:
        raise SystemExit(f"compare_runs.py: {arguments[-1]} needs a value")
    return found


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], _excuses(sys.argv[3:])))
