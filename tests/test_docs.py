"""The README and the pages under docs/ stay true to the repository: every relative link resolves (to a heading of
the page, for ``#anchor`` links), every documented ``kvaudit`` command line parses with kvaudit's own command
line (parsed, never run: no vLLM, no torch), and the README stays a two-minute read that links every page."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from urllib.parse import unquote

import pytest

from conftest import ROOT

DOCS = ROOT / "docs"
README = ROOT / "README.md"
PAGES = [README, *sorted(DOCS.glob("*.md"))]
README_MAX_LINES = 200
SHELL_BLOCKS = {"", "bash", "console", "sh", "shell"}
"""Fenced blocks whose command lines are checked (```text blocks show usage patterns and output, not commands)."""
FENCE = re.compile(r"^\s*(```+|~~~+)\s*([\w+-]*)")
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
"""A Markdown link or image: its target (the text may span lines and hold one level of brackets)."""


def _name(path: Path) -> str:
    return str(path.relative_to(ROOT))


def _blocks(text: str) -> tuple[list[tuple[int, str]], list[tuple[str, list[tuple[int, str]]]]]:
    """The page's lines outside fenced code blocks, and each fenced block (its language, its numbered lines)."""
    prose, blocks, fence, lang, body = [], [], None, "", []
    for n, line in enumerate(text.split("\n"), 1):
        m = FENCE.match(line)
        if fence is None:
            if m:
                fence, lang, body = m.group(1), m.group(2).lower(), []
            else:
                prose.append((n, line))
        elif m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence) and not m.group(2):
            blocks.append((lang, body))
            fence = None
        else:
            body.append((n, line))
    assert fence is None, "a fenced code block is never closed"
    return prose, blocks


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower-case, punctuation dropped (letters, digits, ``_`` and ``-`` kept),
    each space a ``-``."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """The anchors of a page's headings, as GitHub numbers repeated ones (``name``, ``name-1``, ...)."""
    prose, _ = _blocks(path.read_text())
    seen: dict[str, int] = {}
    out = set()
    for _, line in prose:
        m = re.match(r"^ {0,3}#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            base = slug(m.group(1))
            out.add(base if base not in seen else f"{base}-{seen[base]}")
            seen[base] = seen.get(base, 0) + 1
    return out


def links(path: Path) -> list[tuple[int, str]]:
    """The targets of the page's links outside code blocks, with the line each starts on."""
    prose, _ = _blocks(path.read_text())
    text = "\n".join(line for _, line in prose)
    numbers = [n for n, _ in prose]
    return [(numbers[text.count("\n", 0, m.start())], m.group(1)) for m in LINK.finditer(text)]


def test_the_readme_and_docs_exist():
    assert README.is_file() and (DOCS / "README.md").is_file() and len(PAGES) > 3


@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_every_relative_link_resolves(page):
    broken = []
    for n, target in links(page):
        if re.match(r"[a-zA-Z][a-zA-Z+.-]*:", target):  # https:, mailto: ...: not this repository's
            continue
        file, _, anchor = unquote(target).partition("#")
        dest = (page.parent / file).resolve() if file else page
        if not dest.exists():
            broken.append(f"{_name(page)}:{n}: {target}: no such file {dest}")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{_name(page)}:{n}: {target}: no heading #{anchor} in {_name(dest)} "
                          f"(its anchors: {', '.join(sorted(anchors(dest)))})")
    assert not broken, "\n".join(broken)


def test_every_page_starts_with_a_title_and_links_back_to_the_readme():
    for page in PAGES[1:]:
        lines = page.read_text().split("\n")
        assert lines[0].startswith("# ") and lines[1] == "", f"{_name(page)}: no one-line title"
        assert "](../README.md)" in lines[2], f"{_name(page)}: its third line does not link back to the README"


def test_the_readme_is_short_and_links_every_page():
    text = README.read_text()
    assert len(text.splitlines()) < README_MAX_LINES, f"README.md has {len(text.splitlines())} lines"
    targets = {t.partition("#")[0] for _, t in links(README)}
    missing = [f"docs/{p.name}" for p in DOCS.glob("*.md") if f"docs/{p.name}" not in targets]
    assert not missing, f"README.md links none of {missing}"


def command_lines() -> list[tuple[str, int, str]]:
    """Every ``kvaudit ...`` or ``scripts/kvaudit ...`` line of a shell or unlabelled code block: (page, line
    number, the line with ``\\`` continuations joined and a leading ``$ `` dropped)."""
    out = []
    for page in PAGES:
        _, blocks = _blocks(page.read_text())
        for lang, body in blocks:
            if lang not in SHELL_BLOCKS:
                continue
            i = 0
            while i < len(body):
                n, line = body[i]
                while line.rstrip().endswith("\\") and i + 1 < len(body):
                    i += 1
                    line = line.rstrip()[:-1] + " " + body[i][1].strip()
                i += 1
                line = line.strip()
                line = line[2:] if line.startswith("$ ") else line
                if not line.startswith(("kvaudit ", "scripts/kvaudit ")):
                    continue
                if any(s in line for s in ("...", "<", "$(")):  # a pattern, not a command
                    continue
                out.append((_name(page), n, line))
    return out


def _words(line: str) -> list[str]:
    """The command's arguments, as a shell splits them: up to a pipe, a redirection, ``;`` or ``&``, and without a
    trailing ``# comment``; the program's own name dropped."""
    lex = shlex.shlex(line, posix=True, punctuation_chars=True)
    lex.whitespace_split = True
    lex.commenters = "#"
    words = []
    for word in lex:
        if word and set(word) <= set("();<>|&"):
            break
        words.append(word)
    return words[1:]


def parse(args: list[str]) -> str | None:
    """Parse ``kvaudit ARGS`` as ``kvaudit.cli.main`` would, without running the command: None when it parses,
    else the usage error kvaudit would print."""
    import typer

    from kvaudit.cli import app as cli
    from kvaudit.errors import UsageError

    ex = cli._click_exceptions()
    argv = [a for a in args if a != "--debug"]  # main() takes --debug anywhere on the command line
    if {"--install-completion", "--show-completion"} & set(argv):
        return None  # shell completion acts while it parses (it would install itself)
    command = cli._click_command()
    try:
        argv = cli._with_model_named(argv)
        ctx = command.make_context("kvaudit", list(argv))
        protected = ctx._protected_args if hasattr(ctx, "_protected_args") else ctx.protected_args
        rest = [*protected, *ctx.args]
        if rest:
            name, sub, rest = command.resolve_command(ctx, rest)
            sub.make_context(name, rest, parent=ctx)
    except typer.Exit:  # --help, --version: parsed, and they end there
        return None
    except ex.ClickException as e:  # UsageError, NoSuchOption, BadParameter, ...
        return f"{type(e).__name__}: {e.format_message()}"
    except UsageError as e:  # kvaudit's own: an unknown preset, command or model
        return f"UsageError: {e.message}"
    return None


def test_the_parser_here_catches_what_kvaudit_refuses(monkeypatch):
    monkeypatch.chdir(ROOT)
    assert parse(["qwen3-next", "--util", "0.7"]) is None
    assert parse(["plan", "qwen3-next", "--save", "no/such/folder/plan.json"]) is None  # paths are not checked
    assert "--utl" in parse(["qwen3-next", "--utl", "0.7"])
    assert "--format" in parse(["qwen3-next", "--format", "yaml"])
    assert "no-such-model" in parse(["no-such-model"])
    assert parse(["compare", "only-one.json"])  # a missing argument


def test_every_documented_command_parses(monkeypatch, capsys):
    monkeypatch.chdir(ROOT)  # model paths in the docs are relative to the repository's root
    lines = command_lines()
    assert len(lines) >= 15, f"only {len(lines)} documented kvaudit command lines found"
    failures = []
    for page, n, line in lines:
        try:
            error = parse(_words(line))
        except ValueError as e:  # shlex: an unclosed quote
            error = f"cannot split: {e}"
        if error:
            failures.append(f"{page}:{n}: {line}\n    {error}")
    capsys.readouterr()  # what --help printed
    assert not failures, f"{len(failures)} documented command(s) kvaudit would refuse:\n" + "\n".join(failures)
