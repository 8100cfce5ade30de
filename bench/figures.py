"""Figures typed by hand in the docs (issue 63): each measured one is in a block that
:mod:`bench.pages` generates or links the stored result it comes from; ``python -m bench.pages``
(``--check`` too) fails on one that is neither, naming the page, the line and the figure."""

from __future__ import annotations

import functools
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Figures typed by hand (issue 63). A measured figure on a page is either in a generated block
# (above) or in a paragraph, list item or table row that links the stored result file it comes
# from; ``--check`` fails on one that is neither. The rule, as ``unlinked_figures`` applies it:
#
# - a figure: a number (or a range or series of them: "0.05-0.09 s", "0.36 / 0.39 ms") with a
#   unit of time, memory, CPU, a ratio ("1.6x") or a share ("55 %");
# - not looked at: generated blocks, code (fenced, or between backticks: commands, settings and
#   program output written as such), HTML comments, link targets;
# - a paragraph, list item or table row passes when it links a stored result: a file under
#   docs/bench/ ending in .json, .log or .txt, or a heading of docs/bench/runs.md, that exists
#   (a table row also by its table's header row);
# - or when it says "unrecorded": a measured figure no stored file holds, said to the reader;
# - settings and goals are not measurements, but only the few phrases of SETTINGS tell one
#   (a bound, a period, a default, a named timeout) and the machine's own size (MACHINE). Any
#   other figure counts as measured: a setting written otherwise is a false alarm, fixed by
#   writing it as code (`hang-timeout: 10s`, `--node-cap 360`) or as one of those phrases.
FIGURE_PAGES = ("README.md", "docs/*.md", "docs/design/*.md")  # docs/bench/ is the record itself
STORED = (".json", ".log", ".txt")
RUNS = ROOT / "docs" / "bench" / "runs.md"
UNRECORDED = re.compile(r"\bunrecorded\b", re.I)
_NUMBER = r"\d+(?:\.\d+)?"
FIGURE = re.compile(
    rf"(?<![\w.]){_NUMBER}(?:\s?[-\u2013/]\s?{_NUMBER})*"
    r"(?:x|\s?%|[\s-]?(?:ms|µs|us|s|seconds?|min|minutes?|h|hours?|CPU-s|cores?"
    r"|KiB|MiB|GiB|KB|MB|GB|percent))(?![\w-])"
)
SETTINGS: tuple[tuple[re.Pattern[str], re.Pattern[str], str], ...] = (
    # (the text just before the figure, just after it, why the figure is not a measurement)
    # ("->", an arrow, is no bound: "crash -> 5 s" is a measurement)
    (re.compile(r"(?:<=|>=|≤|≥|<|(?<!-)>)\s*[+~]?$"), re.compile(""), "a bound: a goal or limit"),
    (re.compile(r"\bevery\s+$", re.I), re.compile(""), "a period: how often something is done"),
    (re.compile(r"\bdefaults?(?:\s+of)?:?\s+$", re.I), re.compile(""), "a default: a setting"),
    (
        re.compile(""),
        re.compile(
            r"^\s+(?:[\w-]+\s)?"  # (a word between: "10 s hang timeout", "4 GiB memory limit")
            r"(?:timeout|deadline|grace period|cap|period|interval|backoff|window|limit|buffer"
            r"|lease|margin)\b",
            re.I,
        ),
        "a timeout, deadline, grace period, cap, period, backoff, window, limit, buffer, lease or "
        "margin named so: a setting",
    ),
    (
        re.compile(r"\b95$"),
        re.compile(r"^\s?%\s(?:bootstrap\s)?interval\b"),
        "an interval's confidence level, chosen",
    ),
)
# the machine of every run here, as each result file records it: "2 cores", "2-core", "24 GiB"
MACHINE = re.compile(r"2[\s-]cores?|24\sGiB")


def _slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lstrip("#").strip().lower())
    return text.replace(" ", "-")


@functools.cache
def _anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    fence = False
    for line in page.read_text().splitlines():
        fence ^= line.lstrip().startswith(("```", "~~~"))
        if line.startswith("#") and not fence:
            slug = _slug(line)
            out.add(f"{slug}-{seen[slug]}" if slug in seen else slug)
            seen[slug] = seen.get(slug, 0) + 1
    return out


def stored_result(page: Path, target: str) -> bool:
    """Whether a link of ``page`` names a stored result that exists: a file under docs/bench/
    ending in .json, .log or .txt, or a heading of docs/bench/runs.md."""
    path, _, anchor = target.partition("#")
    if not path or "://" in path:
        return False
    where = (page.parent / path).resolve()
    if not where.is_relative_to(ROOT / "docs" / "bench") or not where.is_file():
        return False
    if where == RUNS:
        return anchor in _anchors(RUNS)
    return where.suffix in STORED


_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
_LINK_TARGET = re.compile(r"(?<=\])\([^)\s]*\)")
_CODE = re.compile(r"`[^`]*`")  # (within a paragraph, over a line break too)


def _blank(m: re.Match[str]) -> str:
    """What ``m`` matched, blanked out but for its line breaks (line numbers stay right)."""
    return re.sub(r"[^\n]", " ", m.group(0))


_ITEM = re.compile(r"^\s*(?:[-*+]\s|\d+\.\s|#)")


def _uncomment(line: str, inside: bool) -> tuple[str, bool]:
    """``line`` without HTML comments, and whether one is still open at its end."""
    out = ""
    while True:
        if inside:
            end = line.find("-->")
            if end < 0:
                return out, True
            line, inside = line[end + 3 :], False
        else:
            start = line.find("<!--")
            if start < 0:
                return out + line, False
            out, line, inside = out + line[:start], line[start + 4 :], True


def _units(text: str) -> list[tuple[list[tuple[int, str]], str]]:
    """A page's paragraphs, list items, table rows and headings outside generated blocks,
    fenced code and HTML comments: each as its (line number, line)s and the text that may
    carry its link besides (a table row's header row)."""
    units: list[tuple[list[tuple[int, str]], str]] = []
    current: list[tuple[int, str]] | None = None
    header: str | None = None  # the header row of the table being read
    block = fence = comment = False
    for number, raw in enumerate(text.splitlines(), 1):
        if block:
            block = not raw.startswith("<!-- end ")
            continue
        if raw.startswith("<!-- generated by bench.pages: "):
            block, current, header = True, None, None
            continue
        if raw.lstrip().startswith(("```", "~~~")):
            fence, current, header = not fence, None, None
            continue
        if fence:
            continue
        line, comment = _uncomment(raw, comment) if comment or "<!--" in raw else (raw, False)
        if not line.strip():
            current, header = None, None
            continue
        row = line.lstrip().startswith("|")
        if row:
            current = [(number, line)]
            units.append((current, header or ""))
            header = line if header is None else header
            current = None  # each row is a unit of its own
            continue
        header = None
        if current is None or _ITEM.match(line) or current[-1][1].lstrip().startswith("#"):
            current = []
            units.append((current, ""))
        current.append((number, line))
    return units


def _setting(before: str, figure: str, after: str) -> bool:
    if MACHINE.fullmatch(figure):
        return True
    return any(b.search(before) and a.search(after) for b, a, _ in SETTINGS)


def unlinked(page: Path, text: str | None = None) -> list[str]:
    """Every measured figure of ``page`` outside its generated blocks whose paragraph, list
    item or table row neither links a stored result nor says it is unrecorded: a message each
    that names the page, the line and the figure, and the two fixes."""
    text = page.read_text() if text is None else text
    shown = page.relative_to(ROOT) if page.is_relative_to(ROOT) else page
    problems = []
    for lines, context in _units(text):
        joined = "\n".join(line for _, line in lines)
        marked = joined + "\n" + context
        if UNRECORDED.search(marked):
            continue
        if any(stored_result(page, target) for target in _LINK.findall(marked)):
            continue
        prose = _LINK_TARGET.sub(_blank, _CODE.sub(_blank, joined))
        for m in FIGURE.finditer(prose):
            if _setting(prose[: m.start()], m.group(0), prose[m.end() :]):
                continue
            line = lines[0][0] + prose.count("\n", 0, m.start())
            figure = re.sub(r"\s+", " ", m.group(0))
            problems.append(
                f"{shown}:{line}: {figure!r} is a measured figure outside a generated "
                "block, and its paragraph (list item, table row) links no stored result. Fix: "
                "move it into a block that bench.pages generates, or link the stored file it "
                "comes from (a .json, .log or .txt under docs/bench/, or a heading of "
                "docs/bench/runs.md) in the same paragraph, list item or table row. (No file "
                'holds it: say "unrecorded" there, or remove it. A setting or a goal, not a '
                "measurement: write it as code, `10s`, or as a bound, <= 10 s.)"
            )
    return problems


def pages() -> list[Path]:
    return sorted({p for pattern in FIGURE_PAGES for p in ROOT.glob(pattern)})
