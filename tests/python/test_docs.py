"""The docs a user trusts for numbers: docs/performance.md's current figures are what the result
files give (bench/tables.py), and every speed or ratio the READMEs quote is one of those figures."""
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_current_figures_are_generated_from_the_results():
    result = subprocess.run([sys.executable, str(ROOT / "bench" / "tables.py"), "--check"], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def generated_figures() -> dict:
    """The generated tables' speeds (cells of GB/s columns) and ratios (cells ending in ×)."""
    text = (ROOT / "docs" / "performance.md").read_text()
    block = text[text.index("<!-- tables: generated"):text.index("<!-- tables: end -->")]
    figures = {"GB/s": set(), "×": set()}
    header = None
    for line in block.splitlines():
        if not line.startswith("|"):
            header = None
            continue
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        if header is None:
            header = cells
        elif not set(cells[0]) <= {"-", " "}:
            for name, cell in zip(header, cells):
                if "GB/s" in name:
                    figures["GB/s"].add(cell)
                if cell.endswith("×"):
                    figures["×"].add(cell[:-1])
    return figures


def test_every_figure_a_readme_quotes_is_in_the_generated_tables():
    figures = generated_figures()
    assert len(figures["GB/s"]) > 20 and len(figures["×"]) > 20
    for readme in ("README.md",):
        quoted = re.findall(r"(\d+(?:\.\d+)?)\s*(GB/s|×)", (ROOT / readme).read_text())
        missing = [f"{figure} {unit}" for figure, unit in quoted if figure not in figures[unit]]
        assert not missing, f"{readme} quotes {missing}, which docs/performance.md's tables do not hold"


def test_the_docs_name_no_issue_numbers():
    for page in sorted((ROOT / "docs").glob("*.md")):
        if page.name == "changelog.md":  # what changed when: its entries may name the work
            continue
        found = re.findall(r"[Ii]ssues? \d+", page.read_text())
        assert not found, f"{page.name}: {found}"


def test_the_code_says_why_and_leaves_the_figures_to_the_docs():
    """Measured speeds, times and GPU models live in docs/ (where they carry their run); a comment or
    docstring gives the reason and points there, so that a figure cannot drift in two places."""
    figure = re.compile(r"\d(?:\.\d+)? ?(?:GB/s|GiB/s|ms\b|µs)|\bH[12]00\b")
    found = []
    for room in ("alloc", "hints", "offload", "preload", "include", "python_shim/uvm"):
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
    tracked = subprocess.run(["git", "-C", str(ROOT), "ls-files", "alloc", "hints", "offload", "preload", "include",
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
    for room in ("alloc", "hints", "offload"):
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
    for room in ("alloc", "hints", "offload", "preload", "include", "python_shim/uvm"):
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
