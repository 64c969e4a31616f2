"""The README and docs/ as a reader meets them: every relative link lands on a file and, with a ``#fragment``,
on a heading of it (GitHub's anchor rules); nothing points outside the repository; the code cites only
sections docs/design.md has; and the README's quickstart prints what the README says it prints."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import unicodedata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(r"^(```|~~~)")
LINK = re.compile(r"!?\[(?:[^\]\\]|\\.)*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
CODE_SPAN = re.compile(r"(`+)(.+?)\1")


def prose_lines(text: str) -> list[tuple[int, str]]:
    """The lines outside fenced code blocks, numbered from 1."""
    out, fenced = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line.lstrip()):
            fenced = not fenced
        elif not fenced:
            out.append((number, line))
    return out


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's text (github-slugger): the rendered text lowercased, every character
    but letters, digits, marks, spaces, hyphens and underscores dropped, spaces made hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link reads as its text
    text = CODE_SPAN.sub(lambda m: m.group(2), text).replace("*", "")
    kept = (c for c in text.strip().lower() if c in " -_" or unicodedata.category(c)[0] in "LNM")
    return "".join(kept).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading anchor of a Markdown file, repeats numbered as GitHub numbers them."""
    seen: dict[str, int] = {}
    out = set()
    for _, line in prose_lines(path.read_text()):
        m = re.match(r"^ {0,3}#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        base = slug(m.group(1))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def broken_links(path: Path, root: Path) -> list[str]:
    """What is wrong with each relative link of ``path``: a missing file, a missing anchor, a way out of
    ``root``."""
    problems = []
    lines = dict(prose_lines(path.read_text()))
    prose = "\n".join(lines.get(n, "") for n in range(1, max(lines, default=0) + 1))
    prose = CODE_SPAN.sub(lambda m: " " * len(m.group(0)), prose)  # blanked in place: offsets keep their lines
    for link in LINK.finditer(prose):  # a link's text may run over a line break
        target = link.group(1)
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # https:, mailto: ...
            continue
        where = f"{path.relative_to(root)}:{prose.count(chr(10), 0, link.start()) + 1}: {target}"
        file_part, _, fragment = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        if not dest.is_relative_to(root):
            problems.append(f"{where}: points outside the repository")
        elif not dest.exists():
            problems.append(f"{where}: no such file")
        elif fragment and (dest.suffix != ".md" or fragment not in anchors(dest)):
            problems.append(f"{where}: no heading #{fragment} in {dest.relative_to(root)}")
    return problems


def test_slugs_follow_githubs_rules():
    assert slug("§3 The algebra of a segment") == "3-the-algebra-of-a-segment"
    assert slug("Throughput under a TTFT SLO, over HTTP") == "throughput-under-a-ttft-slo-over-http"
    assert slug("The `hypic` mode: seams (A/B)") == "the-hypic-mode-seams-ab"
    assert slug("[Link](x.md) and `cold_policy`") == "link-and-cold_policy"
    assert slug("Ray — cold prefill") == "ray--cold-prefill"


def test_the_checker_finds_broken_links(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# A page\n\n## Same\n\n## Same\n")
    page = tmp_path / "README.md"
    page.write_text(
        "[ok](docs/a.md) [ok](docs/a.md#a-page) [ok](docs/a.md#same-1) [ok](#top)\n"
        "# Top\n"
        "[gone](docs/b.md) [no anchor](docs/a.md#nope) [out](../elsewhere.md) [web](https://example.com/x)\n"
        "`[in code](docs/c.md)`\n```\n[in a fence](docs/d.md)\n```\n"
        "a link over [two\nlines](docs/e.md)\n"
    )
    found = broken_links(page, tmp_path)
    assert found == [
        "README.md:3: docs/b.md: no such file",
        "README.md:3: docs/a.md#nope: no heading #nope in docs/a.md",
        "README.md:3: ../elsewhere.md: points outside the repository",
        "README.md:8: docs/e.md: no such file",
    ]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page):
    assert broken_links(page, ROOT) == []


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_page_points_outside_the_repository(page):
    assert "../shared" not in page.read_text()


def sources() -> list[Path]:
    """The repository's Python files, this one aside (it names what it looks for)."""
    folders = ("hypic_rag", "kernels", "eval", "training", "integrations", "tests", "examples")
    return [p for f in folders for p in sorted((ROOT / f).rglob("*.py")) if p != Path(__file__).resolve()]


def test_no_code_cites_a_design_note_outside_the_repository():
    citing = [str(p.relative_to(ROOT)) for p in sources() if "HYPIC.md" in p.read_text()]
    assert citing == [], "HYPIC.md is not in the repository: cite docs/design.md"


def test_every_section_the_code_cites_is_a_heading_of_the_design_page():
    design = anchors(ROOT / "docs" / "design.md")
    cited = set()
    for source in sources():
        for ref in re.findall(r"docs/design\.md §(\d+)(?:\s*-\s*§(\d+))?", source.read_text()):
            cited.update(n for n in ref if n)
    assert cited, "the code cites docs/design.md's sections"
    missing = [n for n in sorted(cited) if not any(a.startswith(f"{n}-") for a in design)]
    assert missing == [], f"docs/design.md has no section {missing}"


def quickstart() -> tuple[str, str]:
    """The README's quickstart code and the output it says that code prints."""
    section = README.read_text().split("\n## Quickstart\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```(\w+)\n(.*?)```", section, re.S)
    code = next(body for lang, body in blocks if lang == "python")
    printed = next(body for lang, body in blocks if lang == "text")
    return code, printed


@pytest.mark.docs
def test_the_readme_quickstart_prints_what_the_readme_says():
    code, printed = quickstart()
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert run.returncode == 0, run.stderr
    assert run.stdout == printed


SHELL = ("bash", "sh", "shell", "console")


def fences(page: Path) -> list[tuple[int, str, set[str], str]]:
    """Each fenced block of ``page``: its first line, language, other info words (``notest``...) and code."""
    from markdown_it import MarkdownIt

    out = []
    for token in MarkdownIt().parse(page.read_text()):
        if token.type == "fence":
            lang, *options = token.info.split() or [""]
            out.append((token.map[0] + 1, lang, set(options), token.content))
    return out


RUNNABLE_SHELL = [
    pytest.param(code, id=f"{page.relative_to(ROOT)}:{line}")
    for page in PAGES
    for line, lang, options, code in fences(page)
    if lang in SHELL and "notest" not in options
]


def test_shell_examples_run_or_say_why_not():
    """A shell example either runs here (below) or is marked ``notest`` with the reason in its first line
    (README's two commands aside: they are what runs the suite)."""
    marked = [
        (page, line, code)
        for page in PAGES
        for line, lang, options, code in fences(page)
        if lang in SHELL and "notest" in options
    ]
    assert RUNNABLE_SHELL and marked
    for page, line, code in marked:
        if page != README:
            assert code.startswith("# not run by the tests"), f"{page.name}:{line} says why it does not run"


@pytest.fixture(scope="module")
def bundled_server() -> str:
    """``hypic-rag serve`` as a newcomer starts it (no model: the bundled one), on a free port."""
    from hypic_rag.testing.server import serve_in_process

    with serve_in_process(timeout_s=120) as url:
        yield url


@pytest.mark.docs
@pytest.mark.xdist_group("docs-server")  # one worker runs them all, so one server starts
@pytest.mark.parametrize("code", RUNNABLE_SHELL)
def test_a_shell_example_runs_as_written_against_the_bundled_server(code, bundled_server):
    """``localhost:8000``, the docs' address of ``hypic-rag serve``, is the test server's."""
    script = code.replace("localhost:8000", bundled_server.removeprefix("http://"))
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr + done.stdout
    if done.stdout.lstrip().startswith("{"):
        import json

        answer = json.loads(done.stdout)
        assert answer["choices"][0]["message"]["content"], answer


PYTHON = ("python", "py", "python3")


def python_examples() -> list:
    """Each runnable Python block as pytest-markdown-docs names it (``PAGE::[CodeFence#N][line:L]``, N counting
    the page's runnable Python blocks), so that each runs as a test of its own."""
    out = []
    for page in PAGES:
        runnable = [line for line, lang, options, _ in fences(page) if lang in PYTHON and "notest" not in options]
        rel = page.relative_to(ROOT)
        out += [
            pytest.param(f"{rel}::[CodeFence#{n}][line:{line}]", id=f"{rel}:{line}")
            for n, line in enumerate(runnable, 1)
        ]
    return out


PYTHON_EXAMPLES = python_examples()


def test_every_python_example_runs_or_says_why_not():
    """A block marked ``notest`` says why in its first line."""
    assert PYTHON_EXAMPLES
    for _, lang, options, code in (f for page in PAGES for f in fences(page)):
        if lang in PYTHON and "notest" in options:
            assert code.startswith("# not run by the tests"), code


@pytest.mark.docs
@pytest.mark.parametrize("example", PYTHON_EXAMPLES)
def test_a_python_example_runs_on_the_bundled_model(example):
    """The block runs by pytest-markdown-docs (``continuation`` goes on from the block before) in a pytest of its
    own, so that what it sets up (LlamaIndex's ``Settings.llm``, a process's shared engine and its warm cache)
    meets no other test. That pytest loads only this plugin: the others cost most of its start, and
    pytest-recording's module-scoped fixture cannot attach to a Markdown file."""
    command = [sys.executable, "-m", "pytest", "-o", "addopts=", "-p", "pytest_markdown_docs.plugin", "--markdown-docs"]
    command += ["-p", "no:cacheprovider", "-W", "ignore::pytest.PytestConfigWarning", "-q", example]
    env = {**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "1 passed" in done.stdout and "skipped" not in done.stdout, done.stdout
