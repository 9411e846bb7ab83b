"""Lists the measured figures the docs state that no result file backs.

A figure is a time (µs, ms, s), a speed (GB/s, GiB/s), a ratio (×) or a test count (N passed,
N failed, N skipped) in README.md or a page of docs/, written with its unit or in a table column
whose header gives the unit. It is backed when one of these holds:
- It sits in docs/performance.md's generated tables, and it is in README or its paragraph names
  performance.md (performance.md's own prose names its files). `bench/tables.py --check` keeps
  those tables true.
- A result file under bench/results holds it, within its rounding. The file must be named in the
  figure's paragraph (a table's: its caption, the paragraph before it ending in a colon) or, where
  the paragraph names none, up front (in the heading or the paragraph right after it) in the
  innermost section around it that names any there. A file is named by its path under
  bench/results (`rl/h100.json`, with or without bench/results/ in front), or a whole folder by
  its path ending in / (`pinned_probe/`).
- The paragraph cites a section of measurements.md or performance.md (a heading, or a table's bold
  caption) that states the same figure, as in (`docs/measurements.md`, "Pinned memory"). The cited
  page's own figures are checked too, and a citation of a section that is not there is a problem.
- It is a ratio of two figures quoted in its paragraph, as in 4–7× beside 11.9 and 46.1.
- It is one of uvm's settings (SETTINGS below), and the source that sets it says so.

"Within its rounding" means as written: 76–93 ms is backed by a file holding 0.0761 (seconds) and
93.2 (ms); 12.3× by 12.26.

    python3 scripts/doc_figures.py     lists the figures no file backs; exits 1 if there are any
"""
import re
import sys
from functools import lru_cache
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
PAGES = ["README.md", "docs/faq.md", "docs/python-api.md", "docs/c-api.md", "docs/distributed.md",
         "docs/performance.md", "docs/measurements.md", "docs/design.md"]

NUMBER = r"\d+(?:,\d{3})*(?:\.\d+)?"
UNITS = r"µs|ms|s|GB/s|GiB/s|×|passed|failed|skipped"
# A figure or a list or range of them sharing one unit: "0.5–11 ms", "49.1–49.9 / 40.5–43.1 GB/s".
FIGURE = re.compile(rf"(?<![\w.])((?:{NUMBER}\s*(?:[–-]|/|,| and | to | or )\s*)*{NUMBER})\s*({UNITS})(?![\w/])")
# How a file may hold a figure written in this unit: seconds for ms, bytes per second for GB/s, …
SCALES = {"µs": (1, 1e3, 1e6, 1e-3), "ms": (1, 1e3, 1e-3, 1e6), "s": (1, 1e-3, 1e-6, 1e-9),
          "GB/s": (1, 1e-9, 1.073741824, 1.073741824e-9), "GiB/s": (1, 1 / 1.073741824, 2**-30),
          "×": (1,), "passed": (1,), "failed": (1,), "skipped": (1,)}
CITED_SECTION = re.compile(r'(measurements|performance)\.md`?,? *\(?"([^"]+)"')
GENERATED = ("<!-- tables: generated", "<!-- tables: end -->")

# uvm's settings, which are no measurements: (page, the phrase stating it, source file, a pattern
# that source must hold, so that the page cannot drift from the code).
SETTLE_TIMING = r"milliseconds\(100\), std::chrono::milliseconds\(50\),\s*std::chrono::milliseconds\(2000\)"
SETTINGS = [
    ("docs/c-api.md", "every 50 ms for 2 s", "alloc/settle.cpp", SETTLE_TIMING),
    ("docs/design.md", "every 50 ms from 100 ms after", "alloc/settle.cpp", SETTLE_TIMING),
    ("docs/design.md", "2 s after the last map", "alloc/settle.cpp", SETTLE_TIMING),
    ("docs/performance.md", "every 50 ms for 2 s", "alloc/settle.cpp", SETTLE_TIMING),
]


def numbers_in(text: str) -> list:
    return [float(n.replace(",", "")) for n in re.findall(NUMBER, text)]


@lru_cache(maxsize=None)
def file_numbers(path: Path) -> frozenset:
    return frozenset(float(n) for n in re.findall(r"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?", path.read_text(errors="replace")))


def held(token: str, unit: str, values) -> bool:
    """Whether a value, in a scale the unit allows, rounds to the figure as written."""
    figure = float(token.replace(",", ""))
    half = 0.5 * 10 ** -(len(token.split(".")[1]) if "." in token else 0) * (1 + 1e-9)
    return any(abs(value * scale - figure) <= half for value in values for scale in SCALES[unit])


def result_files(text: str) -> set:
    """The result files a text names (a folder named whole, ending in /, gives all its files)."""
    found = set()
    for name in re.findall(r"(?:bench/results/)?([\w.-]+(?:/[\w.-]+)*/?)", text):
        path = RESULTS / name.rstrip("/")
        if "/" in name and path.is_file():
            found.add(path)
        elif name.endswith("/") and path.is_dir():
            found.update(p for p in path.rglob("*") if p.is_file())
    return found


@lru_cache(maxsize=None)
def page_lines(page: str) -> tuple:
    return tuple((ROOT / page).read_text().splitlines())


def section_text(page: str, title: str) -> str:
    """The text of the page's section whose heading starts with `title` (its subsections included),
    or of the table whose bold caption does (up to the next caption or heading)."""
    lines = page_lines(page)
    for index, line in enumerate(lines):
        heading = re.match(r"(#+) (.*)", line)
        caption = re.match(r"\*\*(.*?)\*\*", line)
        if heading and heading.group(2).strip().startswith(title):
            level = len(heading.group(1))
            ends = (later for later in range(index + 1, len(lines))
                    if (m := re.match(r"(#+) ", lines[later])) and len(m.group(1)) <= level)
        elif caption and caption.group(1).startswith(title):
            ends = (later for later in range(index + 1, len(lines)) if re.match(r"#|\*\*", lines[later]))
        else:
            continue
        return "\n".join(lines[index:next(ends, len(lines))])
    return ""


def paragraphs(page: str):
    """(first line number, text, files named by its sections) per paragraph (each list item is
    one) outside the generated tables and code blocks. A section names its files up front: in its
    heading and the paragraph right after it."""
    lines = page_lines(page)
    heads = [(n, len(m.group(1))) for n, line in enumerate(lines, 1) if (m := re.match(r"(#+) ", line))]
    spans = []  # (first line, last line, files the section's heading and first paragraph name)
    for k, (first, level) in enumerate(heads):
        body = first
        while body < len(lines) and not lines[body].strip():
            body += 1
        intro_end = next((n for n in range(body, len(lines)) if not lines[n].strip() or lines[n].startswith("#")), len(lines))
        last = next((later - 1 for later, later_level in heads[k + 1:] if later_level <= level), len(lines))
        spans.append((first, last, result_files("\n".join(lines[first - 1:intro_end]))))
    out, paragraph, start, generated, fenced = [], [], 0, False, False

    def end_paragraph():
        if paragraph:
            # The innermost section around the paragraph that names files up front names its files.
            files = next((refs for first, last, refs in reversed(spans) if first <= start <= last and refs), set())
            # a table's caption (the paragraph before it, ending in a colon) names the table's files
            if paragraph[0].startswith("|") and out and out[-1][1].rstrip().endswith(":"):
                files = result_files(out[-1][1]) or files
            out.append((start, "\n".join(paragraph), files))
            paragraph.clear()

    for number, line in enumerate([*lines, ""], 1):
        generated = (generated or line.startswith(GENERATED[0])) and not line.startswith(GENERATED[1])
        fenced = fenced != line.startswith("```")
        if generated or fenced or line.startswith("```") or line.startswith("#") or not line.strip():
            end_paragraph()
            continue
        if re.match(r"\s*(?:[-*]|\d+\.) ", line):  # each item of a list is a paragraph of its own
            end_paragraph()
        if not paragraph:
            start = number
        paragraph.append(line)
    return out


def generated_figures() -> dict:
    """The generated tables' cells by unit: speeds (cells of a GB/s column), ratios (cells ending in
    ×) and times (cells of a column in s or ms), as written."""
    text = (ROOT / "docs" / "performance.md").read_text()
    figures = {unit: set() for unit in SCALES}
    header = None
    for line in text[text.index(GENERATED[0]):text.index(GENERATED[1])].splitlines():
        if not line.startswith("|"):
            header = None
            continue
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        if header is None:
            header = cells
            continue
        for name, cell in zip(header, cells):
            if (unit := column_unit(name)) not in (None, "×"):
                figures[unit].update(re.findall(NUMBER, cell))
            if cell.endswith("×"):
                figures["×"].add(cell[:-1].strip())
    return figures


class Unbacked(NamedTuple):
    page: str
    line: int
    figure: str
    why: str

    def __str__(self):
        return f"{self.page}:{self.line}: {self.figure}" + (f" ({self.why})" if self.why else "")


def column_unit(name: str) -> str | None:
    """The unit a table column's cells are in, from its header: "GB/s", "get (s)", "ms a move"."""
    for unit, pattern in (("GB/s", r"GB/s"), ("GiB/s", r"GiB/s"), ("ms", r"\bms\b"), ("µs", r"µs"),
                          ("s", r"\(s\)|\bs$|\bs,|\bs\b(?! ?/)"), ("×", r"×")):
        if re.search(pattern, name):
            return unit
    return None


def figures_of(start: int, paragraph: str, settings: list):
    """(line, number as written, unit) of each figure of a paragraph: those written with their unit,
    and a table's cells under a column whose header gives the unit."""
    for match in FIGURE.finditer(paragraph):
        if any(match.group(0) in phrase for phrase in settings):
            continue
        for token in re.findall(NUMBER, match.group(1)):
            yield start + paragraph[:match.start()].count("\n"), token, match.group(2)
    rows = paragraph.splitlines()
    if not rows[0].startswith("|"):
        return
    units = [column_unit(name) for name in rows[0].strip().strip("|").split("|")]
    for offset, row in enumerate(rows[1:], 1):
        cells = row.strip().strip("|").split("|")
        if set("".join(cells)) <= set("-: "):
            continue
        for unit, cell in zip(units, cells):
            if unit is None:
                continue
            # figures with a unit of their own are counted above; sizes and counts are no figures
            bare = re.sub(r"\d[\d.,]*\s*(?:MiB|GiB|KiB|MB|GB|KB|B|threads?|files?|steps?|cycles?|rounds?|tensors?)\b", "", FIGURE.sub("", cell))
            for token in re.findall(NUMBER, bare):
                yield start + offset, token, unit


def unbacked(page: str) -> list:
    problems = []
    tables = generated_figures()
    for start, paragraph, section_files in paragraphs(page):
        files = result_files(paragraph) or section_files
        values = set().union(*(file_numbers(f) for f in files))
        citations = CITED_SECTION.findall(re.sub(r"\s+", " ", paragraph))
        cited = [numbers_in(section_text(f"docs/{name}.md", title)) for name, title in citations]
        problems += [Unbacked(page, start, f"cites {name}.md, {title!r}", "no such section")
                     for name, title in citations if not section_text(f"docs/{name}.md", title)]
        settings = [phrase for name, phrase, _, _ in SETTINGS if name == page and phrase in paragraph.replace("\n", " ")]
        quoted = numbers_in(paragraph)
        # the generated tables back a figure only where the page says it is theirs
        cites_tables = page == "README.md" or (page != "docs/performance.md" and "performance.md" in paragraph)
        for line, token, unit in figures_of(start, paragraph, settings):
            if held(token, unit, values) or (cites_tables and token in tables[unit]):
                continue
            if any(held(token, "×", numbers) for numbers in cited):  # the cited section states it as written
                continue
            if unit == "×" and any(held(token, "×", [a / b]) for a in quoted for b in quoted if b):
                continue
            problems.append(Unbacked(page, line, f"{token} {unit}", "" if files or cited else "names no result file"))
    return problems


def settings_drifted() -> list:
    return [f"{page}: {phrase!r}, but {source} does not match {pattern!r}" for page, phrase, source, pattern in SETTINGS
            if not re.search(pattern, (ROOT / source).read_text())]


def main() -> int:
    problems = [str(p) for page in PAGES for p in unbacked(page)] + settings_drifted()
    print("\n".join(problems))
    print(f"{len(problems)} figures no result file backs", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
