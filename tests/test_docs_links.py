"""The documentation's links resolve inside the repository.

Every relative link in README.md, CHANGELOG.md, benchmarks/RESULTS.md and docs/*.md (inline
`[text](path)`, `[text](path#anchor)`, `[text](#anchor)`, images and reference definitions) must name
a file that exists in the repository, and an anchor must name a heading of the markdown file it points
at (GitHub's heading ids). No link or path may leave the repository: `../shared` in particular is not
there for a user. A path in a code span that names a markdown file (`` `X.md` ``) must exist too, as
the README's first link once pointed at `../shared/DESIGN.md` that way. http(s) and mailto links are
not checked. Links inside fenced code blocks are not links."""
from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from urllib.parse import unquote

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parent.parent
EXPECTED = ("README.md", "CHANGELOG.md", "benchmarks/RESULTS.md", "docs/architecture.md", "docs/emulation.md",
            "docs/controller.md", "docs/simulator.md", "docs/testing.md")

_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
_CODE_SPAN = re.compile(r"(?<!`)(`+)(?!`)(.+?)(?<!`)\1(?!`)", re.DOTALL)
_INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*(<[^>]*>|[^)\s]*)(?:\s+(?:\"[^\"]*\"|'[^']*'|\([^)]*\)))?\s*\)")
_REF_DEF = re.compile(r"^ {0,3}\[[^\]]+\]:[ \t]*(<[^>]*>|\S+)", re.MULTILINE)
_HEADING = re.compile(r"^ {0,3}(#{1,6})[ \t]+(.*?)[ \t]*#*[ \t]*$")
_HTML_ID = re.compile(r"<a\s+(?:name|id)=\"([^\"]+)\"", re.IGNORECASE)
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
_UNCHECKED_SCHEMES = ("http", "https", "mailto")


def documents(root: Path) -> list[Path]:
    """The markdown files a user reads: README, CHANGELOG, the benchmark results and docs/*.md."""
    names = [root / "README.md", root / "CHANGELOG.md", root / "benchmarks" / "RESULTS.md"]
    names += sorted((root / "docs").glob("*.md"))
    return [p for p in names if p.is_file()]


def prose(text: str) -> str:
    """The text with fenced code blocks blanked out (lines kept, so line numbers stay)."""
    out, fence = [], ""
    for line in text.splitlines():
        m = _FENCE.match(line)
        if fence:
            if m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence) \
                    and not line.strip()[len(m.group(1)):].strip():
                fence = ""
            out.append("")
            continue
        if m:
            fence = m.group(1)
            out.append("")
            continue
        out.append(line)
    return "\n".join(out)


def code_spans(text: str) -> list[re.Match[str]]:
    """Inline code spans of prose (they may run over a line end, not over a blank line)."""
    return [m for m in _CODE_SPAN.finditer(text) if "\n\n" not in m.group(2)]


def slug(heading: str) -> str:
    """GitHub's id for a heading: its text (links and code marks dropped) lower-cased, characters other
    than letters, digits, '_', '-' and spaces removed, spaces turned into '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = re.sub(r"<[^>]+>", "", text).strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every anchor a link may name in a markdown file: heading ids (repeats get -1, -2, ...) and
    explicit `<a name=...>`/`<a id=...>`."""
    seen: dict[str, int] = {}
    found: set[str] = set()
    for line in prose(path.read_text(encoding="utf-8")).splitlines():
        found.update(_HTML_ID.findall(line))
        m = _HEADING.match(line)
        if not m:
            continue
        base = slug(m.group(2))
        n = seen.get(base, 0)
        seen[base] = n + 1
        found.add(base if n == 0 else f"{base}-{n}")
    return found


def inside(root: Path, path: str) -> bool:
    """Whether a lexically normalised path lies in root (symlinks are not followed)."""
    return os.path.commonpath([os.path.normpath(root), path]) == os.path.normpath(root)


def check_target(root: Path, doc: Path, target: str) -> str | None:
    """What is wrong with one link target of `doc`, or None."""
    if target.startswith("<") and target.endswith(">"):
        target = target[1:-1]
    if _SCHEME.match(target):
        scheme = target.split(":", 1)[0].lower()
        return None if scheme in _UNCHECKED_SCHEMES else "not a relative link"
    path_part, _, anchor = target.partition("#")
    path_part = unquote(path_part)
    if path_part.startswith("/"):
        return "an absolute path, not a path in the repository"
    resolved = os.path.normpath(os.path.join(doc.parent, path_part)) if path_part else os.path.normpath(doc)
    if not inside(root, resolved):
        return "points outside the repository"
    if not os.path.exists(resolved):
        return "no such file in the repository"
    if anchor and resolved.endswith(".md") and os.path.isfile(resolved) \
            and unquote(anchor) not in anchors(Path(resolved)):
        return f"no heading with the anchor #{anchor} in {os.path.relpath(resolved, root)}"
    return None


def check_mention(root: Path, doc: Path, span: str) -> str | None:
    """What is wrong with a markdown file named in a code span, or None (other spans are not paths)."""
    span = span.strip()
    if "../shared" in span:
        return "points outside the repository (../shared)"
    if " " in span or not re.search(r"\.md(#|$)", span) or _SCHEME.match(span):
        return None
    path_part = span.partition("#")[0]
    if path_part.startswith("/"):
        return "an absolute path, not a path in the repository"
    for base in (doc.parent, root):
        resolved = os.path.normpath(os.path.join(base, path_part))
        if inside(root, resolved) and os.path.exists(resolved):
            return None
    return "names a markdown file that is not in the repository"


def problems(root: Path) -> list[str]:
    """Every broken or outward link and mention in the documents under root, as 'file:line: target: why'."""
    out = []
    for doc in documents(root):
        rel = doc.relative_to(root)
        raw = doc.read_text(encoding="utf-8")
        if "../shared" in raw:
            first = next(n for n, line in enumerate(raw.splitlines(), 1) if "../shared" in line)
            out.append(f"{rel}:{first}: ../shared: points outside the repository")
        text = prose(raw)

        def line_of(pos: int, text: str = text) -> int:
            return text.count("\n", 0, pos) + 1

        spans = code_spans(text)
        for m in spans:
            mention = " ".join(m.group(2).split())
            why = check_mention(root, doc, mention)
            if why:
                out.append(f"{rel}:{line_of(m.start())}: `{mention}`: {why}")
        bare = list(text)
        for m in spans:  # a link's syntax inside a code span is not a link
            bare[m.start():m.end()] = [c if c == "\n" else " " for c in m.group(0)]
        bare_text = "".join(bare)
        found = [(m.start(1), m.group(1)) for m in _INLINE_LINK.finditer(bare_text)]
        found += [(m.start(1), m.group(1)) for m in _REF_DEF.finditer(bare_text)]
        for pos, target in sorted(found):
            why = check_target(root, doc, target)
            if why:
                out.append(f"{rel}:{line_of(pos)}: {target}: {why}")
    return out


def test_the_documents_are_there():
    found = {str(p.relative_to(ROOT)) for p in documents(ROOT)}
    assert set(EXPECTED) <= found, sorted(set(EXPECTED) - found)


def test_every_relative_link_in_the_documents_resolves_inside_the_repository():
    found = problems(ROOT)
    assert not found, "\n".join(found)


def test_the_readme_links_every_document():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    linked = {os.path.normpath(t.partition("#")[0]) for t in _INLINE_LINK.findall(readme)}
    missing = [name for name in EXPECTED[1:] if name not in linked]
    assert not missing, missing


def test_the_checker_flags_what_is_broken(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# A heading\n\n## Twice\n\n## Twice\n\nBack: [up](../README.md#title)\n")
    (tmp_path / "benchmarks" / "RESULTS.md").write_text("# Results\n")
    (tmp_path / "CHANGELOG.md").write_text("# Changelog\n\n[gone]: docs/gone.md\n")
    (tmp_path / "README.md").write_text("\n".join([
        "# Title",
        "Good: [a](docs/a.md), [b](docs/a.md#a-heading), [twice](docs/a.md#twice-1), [self](#title),",
        "[results](benchmarks/RESULTS.md), ![img](docs/a.md \"a title\"), [web](https://example.com/x.md),",
        "[mail](mailto:someone@example.com), `docs/a.md`, `a command --with spaces.md`, `[code](not/a/link.md)`,",
        "`a span over a line end, [code](nor/this.md)",
        "either`.",
        "Broken: [c](docs/missing.md), [d](docs/a.md#nope), [e](../shared/DESIGN.md),",
        "[f](/etc/passwd), [g](#nothing), [h](file:///etc/passwd), `PLATFORM.md`.",
        "```",
        "[in a fence](nowhere.md)",
        "```",
        "Architecture and definitions: `../shared/DESIGN.md`.",
        "",
    ]))
    found = problems(tmp_path)
    flagged = {line.split(": ", 2)[1] for line in found}
    assert flagged == {"docs/missing.md", "docs/a.md#nope", "../shared/DESIGN.md", "/etc/passwd", "#nothing",
                       "file:///etc/passwd", "`PLATFORM.md`", "`../shared/DESIGN.md`", "docs/gone.md",
                       "../shared"}, "\n".join(found)
    assert any(line.startswith("README.md:7: ../shared/DESIGN.md: points outside") for line in found), found
    assert any(line.startswith("CHANGELOG.md:3: docs/gone.md: no such file") for line in found), found


def test_the_checker_flags_a_broken_link_in_a_copy_of_the_real_documents(tmp_path):
    # the repository as a user has it: the documents copied, everything else linked in place
    for entry in ROOT.iterdir():
        if entry.name in (".git", ".venv", "docs", "benchmarks", "README.md", "CHANGELOG.md"):
            continue
        (tmp_path / entry.name).symlink_to(entry)
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    shutil.copytree(ROOT / "benchmarks", tmp_path / "benchmarks", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("README.md", "CHANGELOG.md"):
        shutil.copy(ROOT / name, tmp_path / name)
    assert problems(tmp_path) == []

    readme = tmp_path / "README.md"
    readme.write_text(readme.read_text() + "\nSee [the design](docs/design.md) and [more](docs/emulation.md#no-such).\n")
    (tmp_path / "docs" / "controller.md").unlink()
    found = problems(tmp_path)
    assert any(": docs/design.md: no such file" in line for line in found), found
    assert any(": docs/emulation.md#no-such: no heading" in line for line in found), found
    assert any(line.startswith("README.md:") and ": docs/controller.md: no such file" in line for line in found), found
    assert any(line.startswith("docs/") and "controller.md: no such file" in line for line in found), found
