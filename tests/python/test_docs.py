"""The docs a user reads: every figure backed by a result file (scripts/doc_figures.py), the
current figures what the result files give and never contradicting themselves (bench/tables.py),
every section and path they point to there, in the user's words, in a newcomer's order."""
import importlib
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_current_figures_are_generated_from_the_results():
    result = subprocess.run([sys.executable, str(ROOT / "bench" / "tables.py"), "--check"], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_figure_a_readme_quotes_is_in_the_generated_tables():
    figures = doc_figures().generated_figures()
    assert len(figures["GB/s"]) > 20 and len(figures["×"]) > 20
    for readme in ("README.md",):
        quoted = re.findall(r"(\d+(?:\.\d+)?)\s*(GB/s|×)", (ROOT / readme).read_text())
        missing = [f"{figure} {unit}" for figure, unit in quoted if figure not in figures[unit]]
        assert not missing, f"{readme} quotes {missing}, which docs/performance.md's tables do not hold"


def test_the_docs_name_no_issue_numbers():
    for page in sorted((ROOT / "docs").glob("*.md")):
        found = re.findall(r"[Ii]ssues? \d+", page.read_text())
        assert not found, f"{page.name}: {found}"


def test_the_code_says_why_and_leaves_the_figures_to_the_docs():
    """Measured speeds, times and GPU models live in docs/ (where they carry their run); a comment or
    docstring gives the reason and points there, so that a figure cannot drift in two places."""
    figure = re.compile(r"\d(?:\.\d+)? ?(?:GB/s|GiB/s|ms\b|µs)|\bH[12]00\b")
    found = []
    for room in ("alloc", "share", "hints", "offload", "preload", "include", "python_shim/uvm"):
        for path in sorted((ROOT / room).rglob("*")):
            if path.suffix in (".cpp", ".hpp", ".h", ".py"):
                found += [f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
                          for number, line in enumerate(path.read_text().splitlines(), 1) if figure.search(line)]
    assert not found, "\n".join(found)


def test_the_readme_layout_names_every_file():
    """README.md's layout table names every file of the library, the shim, bench/, scripts/ and docs/
    (by its name, or by its stem as in `registry.*`), so that a newcomer finds each in one place."""
    text = (ROOT / "README.md").read_text()
    layout = text[text.index("| path | what |"):text.index("## Build options")]
    tracked = subprocess.run(["git", "-C", str(ROOT), "ls-files", "alloc", "share", "hints", "offload", "preload", "include",
                              "python_shim/uvm", "bench", "scripts", "docs"],
                             capture_output=True, text=True, check=True).stdout.split()
    assert len(tracked) > 100, tracked
    missing = []
    for name in tracked:
        path = Path(name)
        if path.parts[0] == "bench" and len(path.parts) > 2:  # results: one folder per benchmark
            continue
        if path.suffix == ".png" and "`*.png`" in layout:
            continue
        if not re.search(rf"`(?:[\w./]*/)?{re.escape(path.stem)}(?:\.\*|\.\w+)?`", layout):
            missing.append(name)
    assert not missing, f"README.md's layout does not name {missing}"


def test_every_result_file_is_named_where_it_is_used():
    """bench/results keeps only what a page or a table uses: each file is named by its path under
    bench/results (in docs/, the READMEs, current.json, bench/'s scripts or a source comment), or
    its folder is named whole in docs/measurements.md."""
    results = ROOT / "bench" / "results"
    texts = [p.read_text() for p in [*(ROOT / "docs").glob("*.md"), ROOT / "README.md",
                                     results / "current.json", *(ROOT / "bench").glob("*.py"), *(ROOT / "bench").glob("*.sh")]]
    for room in ("alloc", "share", "hints", "offload"):
        texts += [p.read_text() for p in (ROOT / room).rglob("*.[ch]pp")]
    everything = "\n".join(texts)
    decisions = (ROOT / "docs" / "measurements.md").read_text()
    files = [p for p in results.rglob("*") if p.is_file()]
    assert len(files) > 50, files
    unnamed = []
    for path in files:
        relative = path.relative_to(results).as_posix()
        if relative == "current.json" or relative in everything:
            continue
        if f"`{path.parent.relative_to(results).as_posix()}/`" in decisions:
            continue
        unnamed.append(relative)
    assert not unnamed, f"result files no page or table names (delete them; git keeps them): {unnamed}"


def test_every_measurements_section_named_elsewhere_exists():
    """A comment or a page that sends the reader to docs/measurements.md names a section that is there."""
    headings = [line.lstrip("#").strip() for line in (ROOT / "docs" / "measurements.md").read_text().splitlines()
                if line.startswith("#")]
    sources = [*(ROOT / "docs").glob("*.md"), ROOT / "README.md"]
    for room in ("alloc", "share", "hints", "offload", "preload", "include", "python_shim/uvm"):
        sources += [p for p in (ROOT / room).rglob("*") if p.suffix in (".cpp", ".hpp", ".h", ".py")]
    reference = re.compile(r'measurements\.md`?,? *\(?"([^"]+)"')
    found, missing = 0, []
    for source in sources:
        # References may wrap: join the lines, dropping a comment's leading // or #.
        text = re.sub(r"\s*\n\s*(?://|#)?\s*", " ", source.read_text())
        for title in reference.findall(text):
            found += 1
            if not any(heading.startswith(title) for heading in headings):
                missing.append(f"{source.relative_to(ROOT)}: {title!r}")
    assert found > 20, found
    assert not missing, missing


def tool(folder: str, name: str):
    """A script of the tree's (scripts/doc_figures.py, bench/tables.py) as a module."""
    sys.path.insert(0, str(ROOT / folder))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.pop(0)


def doc_figures():
    return tool("scripts", "doc_figures")


def test_every_figure_the_docs_state_is_backed_by_a_result_file():
    """scripts/doc_figures.py: every time, speed, ratio and test count in README and docs/ is in the
    generated tables, or in a result file its paragraph (or its section, up front) names, or in a
    measurements.md or performance.md section it cites (see the script for the rules)."""
    figures = doc_figures()
    found = [str(problem) for page in figures.PAGES for problem in figures.unbacked(page)]
    assert not figures.settings_drifted(), figures.settings_drifted()
    assert not found, "\n".join(found)


# Claims a review found with no result file behind them, or a different one: (page, the text that
# replaced it, the claim as it stood).
PUT_BACK = [
    ("docs/faq.md", "In the\nsleep/wake benchmark with the GPU otherwise full (H200, `bench/results/rl/h200.json`, pattern\n"
     "\"full\"), a managed pool's offload showed 0 bytes freed, and the training step's allocation of the\n"
     "bytes it had moved then took 103.4–113.6 ms (783.8 ms the first time), against 0.4–0.9 ms after a\n"
     "`uvm.memory_saver` or torch_memory_saver pause,",
     "Measured\non an H200 with the GPU otherwise full, 0 bytes showed as freed, and allocating 3.5 GiB that could\n"
     "only come from them took 76–93 ms (4 ms after torch_memory_saver's release)."),
    ("docs/faq.md", "(H100, `bench/results/rl/h100.json`, pattern \"full\": 0.6–0.8 ms",
     "(0.5–11 ms for 4.4 GiB with the GPU otherwise full, against 78–89 ms for a managed pool: 0.6–0.8 ms"),
    ("docs/faq.md", "(`bench/results/peers/tms-tests-h100.txt`): torch_memory_saver `25 passed, 11 skipped`, uvm `25 passed,\n11 skipped`",
     "(2026-11-25): the original `19 passed, 11 skipped`, uvm `19 passed,\n11 skipped`"),
    ("docs/faq.md", "`bench/results/lifetime/h100.json`): allocating", "`bench/lifetime_bench.py`): 12.5 ms, 7.9 ms; allocating"),
    ("docs/faq.md", "torch_memory_saver (H100, `bench/results/rl/h100.json`).",
     "torch_memory_saver; 0.44–0.61 s a cycle with uvm, 2.4–2.5 s with torch_memory_saver."),
    ("docs/performance.md", "(H100, `bench/results/claim_probe/h100.txt`)", "(27.6 against 55.4 GB/s, H200)"),
]


def test_the_claims_a_review_found_fail_when_put_back(monkeypatch):
    figures = doc_figures()
    pages = {page: (ROOT / page).read_text() for page, _, _ in PUT_BACK}
    for page, now, before in PUT_BACK:
        assert now in pages[page], (page, now)
        assert not [p for p in figures.unbacked(page) if p.page == page], page
        lines = tuple(pages[page].replace(now, before, 1).splitlines())
        monkeypatch.setattr(figures, "page_lines", lambda name, lines=lines, page=page:
                            lines if name == page else tuple((ROOT / name).read_text().splitlines()))
        flagged = [p.figure for p in figures.unbacked(page)]
        assert flagged, f"{page}: {before!r} in place of {now!r} went unnoticed"
        monkeypatch.undo()


def test_a_ratio_the_cells_beside_it_do_not_give_is_caught():
    """bench/tables.py --check recomputes every ratio column from the cells it stands beside: the
    streaming table once printed the link-bound time for all bytes (0.230 s) beside a ratio taken
    over the bytes moved (1.04× for 0.207 s)."""
    tables = tool("bench", "tables")
    generated = tables.block()
    assert not tables.contradictions(generated)
    assert "| 0.198 | 0.207 |" in generated
    assert tables.contradictions(generated.replace("| 0.198 | 0.207 |", "| 0.230 | 0.207 |"))
    big_uvm = next(line for line in generated.splitlines() if line.startswith("| big | uvm releasable |"))
    cells = big_uvm.split(" | ")
    cells[5] = "9.99×"  # faster than torch_memory_saver
    assert tables.contradictions(generated.replace(big_uvm, " | ".join(cells)))
    node_row = next(line for line in generated.splitlines() if line.startswith("| uvm memory_saver | 4 |"))
    cells = node_row.split(" | ")
    cells[4] = "99%"  # pause / pinned memcpy with as many GPUs
    assert tables.contradictions(generated.replace(node_row, " | ".join(cells)))


def test_every_section_a_page_cites_is_there():
    """The docs send the reader on as (`docs/faq.md`, "Title"): the page exists and has a heading, or
    a table caption, that starts with the title."""
    citation = re.compile(r'`(?:docs/)?([\w-]+)\.md`?,? *\(?"([^"]+)"')
    figures = doc_figures()
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    found, missing = 0, []
    for page in pages:
        for name, title in citation.findall(re.sub(r"\s+", " ", page.read_text())):
            found += 1
            target = "README.md" if name == "README" else f"docs/{name}.md"
            if not (ROOT / target).exists() or not figures.section_text(target, title):
                missing.append(f"{page.name}: {name}.md, {title!r}")
    assert found > 30, found
    assert not missing, missing


# The team's words, which mean nothing to a user: where a run happened (a machine's name, a lease,
# a commit, a day), and what the team calls things ("the original", "the seed", "the peer", "rooms").
TEAM_WORDS = {
    "a commit hash": r"(?<![\w/.-])[0-9a-f]{7,12}(?![\w/.-])",
    "an internal machine name": r"nvidia-h[12]00",
    # a device lent for a while; a staged piece's lease on its block is a thing in the code
    "a lease": r"(?<!by )\bleases?\b(?! is dropped)",
    "an experiment's date": r"\b20\d\d-\d\d-\d\d\b",
    "the team's name for a project": r"\bthe (?:originals?|seed|peers?)\b",
    "the team's name for a part of the tree": r"\brooms?\b",
}


def test_the_docs_speak_the_users_words():
    """README and docs/ say torch_memory_saver, Megatron-Core, a part of the tree, an H100 — not the
    team's names for them — and carry no commit hashes or dates of experiments (a generated table's
    caption keeps the day of its run, with the rest of its record)."""
    found = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text, generated = page.read_text(), ""
        if page.name == "changelog.md":  # a release's heading carries its date
            text = "\n".join(line for line in text.splitlines() if not line.startswith("## "))
        if "<!-- tables: generated" in text:  # a run's record keeps its day, and nothing else of ours
            begin, end = text.index("<!-- tables: generated"), text.index("<!-- tables: end -->")
            text, generated = text[:begin] + text[end:], text[begin:end]
        for what, pattern in TEAM_WORDS.items():
            found += [f"{page.name}: {what}: {m.group(0)!r}" for m in re.finditer(pattern, text)]
            if what != "an experiment's date":
                found += [f"{page.name} (generated): {what}: {m.group(0)!r}" for m in re.finditer(pattern, generated)]
    assert not found, "\n".join(found)


def test_the_changelog_reads_as_releases():
    """Each release is a heading with its version and its date (or "not yet released"), and its
    entries sit under New, Changed, Fixed or Removed: what changed for the user, not the order the
    work was done in."""
    text = (ROOT / "docs" / "changelog.md").read_text()
    releases = re.findall(r"^## (\S+) — (.+)$", text, re.M)
    assert releases, "no release heading"
    for version, when in releases:
        assert re.fullmatch(r"\d+\.\d+\.\d+", version), version
        assert re.fullmatch(r"\d{4}-\d\d-\d\d|not yet released", when), when
    kinds = re.findall(r"^### (.+)$", text, re.M)
    assert kinds and all(re.match(r"(New|Changed|Fixed|Removed)\b", kind) for kind in kinds), kinds
    header = (ROOT / "include" / "uvm.h").read_text()
    version = ".".join(re.search(rf"#define UVM_VERSION_{part} (\d+)", header).group(1) for part in ("MAJOR", "MINOR", "PATCH"))
    assert releases[0][0] == version, f"the newest release is {releases[0][0]}, uvm.h says {version}"


def test_a_newcomer_reads_the_readme_in_order():
    """Install, switch a stack, see how fast it is on this GPU, know what to do when something is
    wrong: README's sections come in that order, before building from source."""
    headings = re.findall(r"^## (.+)$", (ROOT / "README.md").read_text(), re.M)
    path = ["Install", "Switch a stack onto uvm", "How fast on my GPU", "When something is wrong",
            "Build from source: two commands"]
    assert [h for h in headings if h in path] == path, headings


def test_a_table_cell_no_result_file_holds_is_caught(monkeypatch):
    """A table's cells take their unit from the column header and their files from the caption
    before the table: a cell changed to a figure its file does not hold is flagged."""
    figures = doc_figures()
    page = "docs/measurements.md"
    text = (ROOT / page).read_text()
    row = "| `cudaHostAlloc(Portable)` | 2.098, 1.666 |"
    assert row in text and not figures.unbacked(page)
    lines = tuple(text.replace(row, "| `cudaHostAlloc(Portable)` | 2.398, 1.666 |").splitlines())
    monkeypatch.setattr(figures, "page_lines", lambda name: lines if name == page else tuple((ROOT / name).read_text().splitlines()))
    assert [p.figure for p in figures.unbacked(page)] == ["2.398 s"]


def test_every_path_the_docs_name_is_there():
    """A path of the tree a page names in backticks (`offload/media/pinned.cpp`, `bench/probes/`,
    `alloc/slabs.*`; result files by their path under bench/results) exists: no dead reference."""
    import fnmatch
    tracked = subprocess.run(["git", "-C", str(ROOT), "ls-files"], capture_output=True, text=True, check=True).stdout.split()
    places = set(tracked) | {str(parent) for name in tracked for parent in Path(name).parents}
    tops = ("alloc/", "hints/", "offload/", "preload/", "include/", "python_shim/", "tests/", "bench/", "scripts/",
            "docs/", ".ci/")
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "bench" / "probes" / "README.md"]
    named, dead = 0, []
    for page in pages:
        for ref in re.findall(r"`([A-Za-z0-9_.*/-]+)`", page.read_text()):
            if not ref.startswith(tops):
                continue
            named += 1
            candidates = [ref.rstrip("/"), "bench/results/" + ref.rstrip("/")]
            if not any(fnmatch.filter(places, c) for c in candidates):
                dead.append(f"{page.relative_to(ROOT)}: {ref}")
    assert named > 100, named
    assert not dead, dead
