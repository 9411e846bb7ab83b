"""The counts CI reads, without a GPU: scripts/summarize_tests.py reads every pytest closing line
(warnings too), tests/python/run_pytest.sh fails in CI where pytest is missing, and
tests/peers/compare_runs.py fails a comparison that compared nothing."""
import os
import re
import subprocess
import sys

import pytest

from conftest import ROOT

sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "tests" / "peers"))


def test_every_pytest_closing_line_is_read_warnings_included():
    from summarize_tests import counts
    assert counts("250 passed, 12 skipped, 3 warnings in 100.20s") == (250, 0, 12)
    assert counts("=== 1 failed, 5 passed, 1 warning in 2.00s ===") == (5, 1, 0)
    assert counts("2 passed, 1 error, 4 deselected in 0.10s") == (2, 1, 0)
    assert counts("test cases: 3 | 2 passed | 1 failed") == (2, 1, 0)
    assert counts("nothing that counts") is None


def test_a_missing_pytest_skips_outside_ci_and_fails_in_it(tmp_path):
    no_pytest = tmp_path / "python"
    no_pytest.write_text("#!/bin/sh\nexit 1\n")  # every `python -m pytest --version` fails
    no_pytest.chmod(0o755)
    env = {key: value for key, value in os.environ.items() if key != "CI"}
    env["UVM_PYTHON"] = str(no_pytest)
    script = str(ROOT / "tests" / "python" / "run_pytest.sh")
    outside = subprocess.run(["bash", script, str(ROOT)], env=env, capture_output=True, text=True)
    assert outside.returncode == 77 and "SKIP: pytest is not installed" in outside.stdout
    inside = subprocess.run(["bash", script, str(ROOT)], env={**env, "CI": "true"}, capture_output=True, text=True)
    assert inside.returncode == 1 and "FAIL: pytest is not installed" in inside.stdout


def report(path, cases):
    """A junit report of (name, outcome) cases."""
    body = "".join(f'<testcase classname="test_x" name="{name}">'
                   + {"passed": "", "failed": "<failure/>", "skipped": "<skipped/>", "error": "<error/>"}[outcome]
                   + "</testcase>" for name, outcome in cases)
    path.write_text(f"<testsuites><testsuite>{body}</testsuite></testsuites>")
    return str(path)


def test_a_comparison_that_compared_nothing_or_ran_on_a_failing_original_fails(tmp_path, capsys):
    from compare_runs import main
    a, b = tmp_path / "a.xml", tmp_path / "b.xml"
    assert main(report(a, [("t1", "passed"), ("t2", "skipped")]), report(b, [("t1", "passed"), ("t2", "skipped")])) == 0
    assert main(report(a, [("t1", "passed")]), report(b, [("t1", "failed")])) == 1  # worse on uvm
    assert main(report(a, []), report(b, [])) == 1
    assert "no test in either report" in capsys.readouterr().out
    assert main(report(a, [("collect", "error")]), report(b, [("collect", "error")])) == 1
    assert "errored (collection?) on the original and uvm" in capsys.readouterr().out
    assert main(report(a, [("t1", "failed"), ("t2", "failed")]), report(b, [("t1", "failed"), ("t2", "failed")])) == 1
    assert "the original passed no test" in capsys.readouterr().out


def test_an_excused_test_may_fail_on_uvm_with_its_reason_and_an_excuse_not_needed_fails(tmp_path, capsys):
    from compare_runs import _excuses, main
    a, b = tmp_path / "a.xml", tmp_path / "b.xml"
    original = report(a, [("t1", "passed"), ("t2", "passed")])
    assert main(original, report(b, [("t1", "passed"), ("t2", "failed")]), {"test_x.py::t2": "patches internals"}) == 0
    assert "test_x.py::t2: original passed, uvm failed  (excused: patches internals)" in capsys.readouterr().out
    assert main(original, report(b, [("t1", "passed"), ("t2", "failed")]), {"test_x.py::t1": "why"}) == 1  # t2 not excused
    assert main(original, report(b, [("t1", "passed"), ("t2", "passed")]), {"test_x.py::t2": "why"}) == 1
    assert "the excuse for test_x.py::t2 is not needed (uvm: passed)" in capsys.readouterr().out
    assert main(original, report(b, [("t1", "passed"), ("t2", "passed")]), {"test_x.py::gone": "why"}) == 1
    assert _excuses(["--excused", "f.py::t=a = b"]) == {"f.py::t": "a = b"}
    with pytest.raises(SystemExit, match="expected --excused"):
        _excuses(["--excuse", "f.py::t=why"])


def test_a_mutant_whose_tests_fail_without_it_is_broken_not_killed(tmp_path, monkeypatch, capsys):
    """A pytest selection that fails as the source is (an import that cannot work, a renamed test) would
    count every mutant it selects as killed: it is run unmutated first, and its mutants are BROKEN."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import mutants
    target = tmp_path / "module.py"
    target.write_text("answer = 1\n")
    monkeypatch.setattr(mutants, "MUTANTS", [(str(target), "answer = 1", "answer = 2", "pytest", "t.py::a"),
                                             (str(target), "answer = 1", "answer = 3", "pytest", "t.py::a")])
    runs = []
    monkeypatch.setattr(mutants, "run_mutant_tests", lambda *args: runs.append(target.read_text()) or "failed")
    monkeypatch.setattr(mutants.subprocess, "run", lambda *args, **kwargs: None)  # the closing rebuild
    monkeypatch.setattr(sys, "argv", ["mutants.py", "--build", str(tmp_path)])
    assert mutants.main() == 1
    out = capsys.readouterr().out
    assert out.count("BROKEN: mutant") == 2 and "KILLED" not in out
    assert runs == ["answer = 1\n"]  # once per selection, unmutated; no mutant applied
    assert "0 of 0 killed (0 by a timeout, 0 by a crash), 0 stale, 2 broken, 0 not a kill" in out
    runs.clear()
    monkeypatch.setattr(mutants, "run_mutant_tests",
                        lambda *args: runs.append(target.read_text()) or ("failed" if "2" in runs[-1] else "passed"))
    assert mutants.main() == 1  # the second mutant survives
    out = capsys.readouterr().out
    assert "KILLED: mutant 0" in out and "SURVIVED: mutant 1" in out
    assert runs == ["answer = 1\n", "answer = 2\n", "answer = 3\n"] and target.read_text() == "answer = 1\n"


@pytest.mark.parametrize("last_stdout", ["All tests passed (3 assertions in 1 test case)",
                                         "model: 12 sequences\ntest cases: 1 | 1 passed"])
def test_the_mutation_checks_counts_join_the_total_whatever_the_suite_printed_last(tmp_path, capsys, last_stdout):
    """A survivor must make the closing line red: the mutation check's result file joins the total,
    whatever the last program of the suite printed (its random sequences once shadowed the list of
    result files, and a survivor left CI green)."""
    import json
    from summarize_tests import main
    log = tmp_path / "testlog.json"
    log.write_text(json.dumps({"name": "uvm:cpu / alloc", "result": "OK", "stdout": "test cases: 2 | 2 passed"}) + "\n"
                   + json.dumps({"name": "uvm:cpu / model", "result": "OK", "stdout": last_stdout}) + "\n")
    mutants = tmp_path / "mutants.json"
    mutants.write_text(json.dumps({"name": "mutants", "passed": 41, "failed": 1,
                                   "summary": "mutants: 41 of 42 killed, 0 stale"}) + "\n")
    assert main(str(log), [str(mutants)]) == 1
    out = capsys.readouterr().out
    assert "mutants: mutants: 41 of 42 killed, 0 stale" in out
    assert out.strip().splitlines()[-1] == "44 passed, 1 failed, 0 skipped"


def test_every_source_file_has_a_mutant_or_says_why_not():
    """Issue 76, item 7: 34 of 83 source files had no mutant, unnamed. Each file of alloc/, hints/,
    offload/, preload/ and python_shim/ has one, or scripts/mutants.py's NO_MUTANT says why not; an
    entry there names a file that exists and has none."""
    import mutants
    sources = {str(path.relative_to(ROOT)) for folder in ("alloc", "share", "hints", "offload", "preload", "python_shim")
               for path in (ROOT / folder).rglob("*") if path.suffix in (".cpp", ".cu", ".py")
               and "__pycache__" not in path.parts and "egg-info" not in str(path)}
    mutated = {mutant[0] for mutant in mutants.MUTANTS}
    assert not sources - mutated - set(mutants.NO_MUTANT), "no mutant and no reason: " + ", ".join(
        sorted(sources - mutated - set(mutants.NO_MUTANT)))
    assert not set(mutants.NO_MUTANT) & mutated, "has mutants, yet NO_MUTANT says why not"
    assert set(mutants.NO_MUTANT) <= sources, "NO_MUTANT names files that are not there"
    assert all(len(reason) > 10 for reason in mutants.NO_MUTANT.values())


def test_a_mutant_counts_as_killed_only_when_a_test_failed(tmp_path, monkeypatch, capsys):
    """Issue 76, item 1: any non-zero exit counted as a kill: a renamed node id (pytest's exit 5), a
    collection error (2), a missing pytest, a crash. Only a test's failure kills; a timeout kills and is
    said apart; the rest is "not a kill" and fails the check."""
    import mutants
    target = tmp_path / "module.py"
    target.write_text("answer = 1\n")
    monkeypatch.setattr(mutants, "MUTANTS", [(str(target), "answer = 1", f"answer = {n}", "pytest", f"t.py::{n}")
                                             for n in (2, 3, 4)])
    outcomes = {"answer = 2\n": "failed", "answer = 3\n": "timeout", "answer = 4\n": "error: pytest exit 5"}
    monkeypatch.setattr(mutants, "run_mutant_tests", lambda *args: outcomes.get(target.read_text(), "passed"))
    monkeypatch.setattr(mutants.subprocess, "run", lambda *args, **kwargs: None)
    monkeypatch.setattr(sys, "argv", ["mutants.py", "--build", str(tmp_path)])
    assert mutants.main() == 1
    out = capsys.readouterr().out
    assert "KILLED: mutant 0" in out and "KILLED: mutant 1" in out and "(by a timeout)" in out
    assert "NOT A KILL: mutant 2" in out and "pytest exit 5" in out
    assert "mutants: 2 of 2 killed (1 by a timeout, 0 by a crash), 0 stale, 0 broken, 1 not a kill" in out


def test_pytest_exit_codes_other_than_a_failed_test_are_not_kills(tmp_path, monkeypatch):
    import mutants
    answers = iter([0, 1, 2, 5])
    monkeypatch.setattr(mutants.subprocess, "run",
                        lambda *args, **kwargs: subprocess.CompletedProcess(args, next(answers)))
    assert [mutants.run_mutant_tests(str(tmp_path), "pytest", "t.py::a", {}) for _ in range(4)] == [
        "passed", "failed", "error: pytest exit 2", "error: pytest exit 5"]


def test_a_catch2_tag_that_names_no_test_is_broken_not_survived(tmp_path, monkeypatch, capsys):
    """Catch2 runs no test and passes for a tag that names none (renamed): every mutant it selected
    survived for nothing, or with a failing build step was killed for nothing."""
    import mutants
    target = tmp_path / "source.cpp"
    target.write_text("int answer = 1;\n")
    monkeypatch.setattr(mutants, "MUTANTS", [(str(target), "answer = 1", "answer = 2", "offload_tests", "[renamed]")])
    monkeypatch.setattr(mutants, "catch2_selects_nothing", lambda *args: True)
    monkeypatch.setattr(mutants, "run_mutant_tests", lambda *args: "passed")
    monkeypatch.setattr(mutants.subprocess, "run", lambda *args, **kwargs: None)
    monkeypatch.setattr(sys, "argv", ["mutants.py", "--build", str(tmp_path)])
    assert mutants.main() == 1
    out = capsys.readouterr().out
    assert "BROKEN: mutant 0: its tests (offload_tests [renamed]) without it: selects no test" in out


def test_what_ci_never_runs_is_named_with_where_it_runs_and_the_table_is_current(tmp_path, monkeypatch):
    """Issue 76, item 8: the tests that skip on the CPU machine, where each runs instead and when it
    last passed there: docs/gpu-tests.md, written by scripts/gpu_only.py from the tree and a record
    that only a run that passed something and failed nothing writes."""
    import gpu_only
    keys = {row["key"] for row in gpu_only.rows()}
    for path in (ROOT / "tests" / "python").glob("test_*.py"):
        if re.search(r"^\s*pytest\.skip\(.*allow_module_level=True", path.read_text(), re.MULTILINE):
            assert str(path.relative_to(ROOT)) in keys, path
    assert {str(p.relative_to(ROOT)) for p in (ROOT / "tests" / "peers").glob("run_*.sh")} <= keys
    assert "tests/gpu" in keys
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_only.py"), "--check"], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stdout
    red = tmp_path / "red.txt"
    red.write_text("91 passed, 1 failed, 0 skipped\n")
    assert gpu_only.passes_in("tests/gpu", red) is None
    red.write_text("0 passed, 0 failed\n")
    assert gpu_only.passes_in("tests/gpu", red) is None
    xml = tmp_path / "run.xml"
    xml.write_text('<testsuites><testsuite><testcase classname="tests.python.test_vllm_gpu" name="a"/>'
                   '<testcase classname="tests.python.test_vllm_gpu" name="b"><failure/></testcase>'
                   '<testcase classname="tests.python.test_pools_gpu" name="c"/></testsuite></testsuites>')
    assert gpu_only.passes_in("tests/python/test_vllm_gpu.py", xml) is None
    assert gpu_only.passes_in("tests/python/test_pools_gpu.py", xml) == "1 passed, 0 failed"


SAVER_USE = r'''
import sys, types
sys.path.insert(0, sys.argv[1])
import megatron_tests
from uvm import _lib

paused = set()  # what "uvm's library" holds paused, by tag
_lib.paused_count = lambda name: int(name in paused)

owner = types.ModuleType("uvm.stand_in_saver")
class Saver:
    def pause(self, tag=None):
        paused.add(tag)
    def resume(self, tag=None):
        paused.discard(tag)
owner.Saver = Saver
Saver.__module__ = owner.__name__
owner._state = types.SimpleNamespace(selected=lambda tag: [tag])
sys.modules[owner.__name__] = owner
sys.modules["torch_memory_saver"] = types.SimpleNamespace(torch_memory_saver=Saver())

use = megatron_tests.SaverUse()
status = megatron_tests.pytest.main([sys.argv[2], "-q", "-p", "no:cacheprovider"], plugins=[use])
print("counted" if use.report() else "not counted", status)
'''

TESTS = {
    "touches": '''
HAVE_TORCH_MEMORY_SAVER = True
from torch_memory_saver import torch_memory_saver as saver
def test_pauses_and_resumes():
    saver.pause("kv"); saver.resume("kv")
def test_keeps_its_memory():
    pass
def test_pauses_nothing_uvm_holds():
    saver.resume("never paused")
''',
    "touches none": '''
HAVE_TORCH_MEMORY_SAVER = True
def test_keeps_its_memory():
    pass
''',
    "found no saver": '''
HAVE_TORCH_MEMORY_SAVER = False
from torch_memory_saver import torch_memory_saver as saver
def test_returns_early():
    saver.pause("kv"); saver.resume("kv")
''',
}


@pytest.mark.parametrize("case", TESTS)
def test_megatrons_tests_count_on_uvm_only_what_paused_memory_through_uvm(tmp_path, case):
    """Megatron's suspend/resume tests pass without the saver in 4 of 6 cases, and pass returning early
    when their module found none: only a test that paused and resumed memory through uvm counts."""
    test_file = tmp_path / "test_megatron_like.py"
    test_file.write_text(TESTS[case])
    done = subprocess.run([sys.executable, "-c", SAVER_USE, str(ROOT / "tests" / "peers"), str(test_file)],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(ROOT / "python_shim")})
    out = done.stdout
    assert done.returncode == 0, done.stderr
    if case == "touches":
        assert "on uvm: 1 of 3 passed tests" in out
        assert "not counted): test_keeps_its_memory, test_pauses_nothing_uvm_holds" in out
        assert "counted 0" in out
    elif case == "touches none":
        assert "on uvm: 0 of 1 passed tests" in out and "not counted 0" in out
    else:
        assert "FAIL: test_megatron_like found no torch_memory_saver" in out and "not counted 0" in out
