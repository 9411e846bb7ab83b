"""Compares two pytest runs of the same test files test by test (their --junitxml reports): the
original's and uvm's. Prints each test's outcome on both, and fails (exit 1) on any test that passed
on the original but not on uvm, or that ran on one and not the other; and when the comparison could
be green for nothing: no test in either report, a collection error (an "error" outcome) on either
side, or an original that passed no test (uvm failing the same would look alike). A test that passes
on uvm and not on the original is shown, not failed.

    python3 compare_runs.py ORIGINAL.xml UVM.xml
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


def main(original_path: str, uvm_path: str) -> int:
    original, uvm = outcomes(original_path), outcomes(uvm_path)
    worse = []
    for name in sorted(set(original) | set(uvm)):
        before, after = original.get(name, "absent"), uvm.get(name, "absent")
        mark = ""
        if before == "passed" and after != "passed" or "absent" in (before, after):
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
    return 1 if worse or empty else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
