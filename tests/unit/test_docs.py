"""The documentation stays honest (issue 30). In README.md, docs/*.md and tests/README.md:

- every relative link resolves to a file of the repository, and an `#anchor` to a heading of
  that file (GitHub's slugs);
- every command shown, in a code block or in inline code, is one the project has: `cdc
  <subcommand> --flag` against the `cdc` command's own argparse parser (built in-process, and
  each subcommand's `--help` parses), `./run.sh <command>` against run.sh's commands,
  `./run.sh bench <name> --flag` against bench/<name>.py's arguments, and `./run.sh test
  <file>` against the test files;
- every repository path named in code (`connectors/mysql/reader_process.py`, `tests/unit/...`; in
  tests/README.md also `unit/...` and `integration/...`, relative to tests/) exists;
- the README still opens with the two commands CI and the team rely on, and every complete
  `relay.toml` shown loads with the relay's own config loader.

A failure names the file, the line and what is broken."""

from __future__ import annotations

import argparse
import ast
import contextlib
import io
import re
import shlex
import tomllib
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from cdc.config import load_config
from cdc_cli.main import build_parser

ROOT = Path(__file__).resolve().parents[2]
DOC_FILES = (ROOT / "README.md", ROOT / "tests" / "README.md", *sorted((ROOT / "docs").glob("*.md")))

FENCE = re.compile(r"^\s*(```|~~~)")
INLINE_CODE = re.compile(r"(`+)(.+?)\1", re.DOTALL)
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_LINK = re.compile(r"^\s*\[[^\]]+\]:\s*(\S+)", re.MULTILINE)
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
PLACEHOLDER = re.compile(r"^(<.*>|\.\.\.|[A-Z][A-Z_]*|\$.*)$")


@dataclass(frozen=True)
class Snippet:
    """Text found at a line of a doc file: a code-block line, or an inline code span."""

    path: Path
    line: int
    text: str

    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def _split(text: str) -> tuple[list[tuple[int, str]], str]:
    """A doc's code-block lines (fenced, or indented 4+ spaces after a blank or code line),
    and its prose with every code-block line blanked (line numbers kept)."""
    code: list[tuple[int, str]] = []
    prose: list[str] = []
    fenced = False
    previous_blank_or_code = True
    for n, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            prose.append("")
            previous_blank_or_code = True
            continue
        indented = line.startswith("    ") and line.strip() and previous_blank_or_code
        if fenced or indented:
            code.append((n, line))
            prose.append("")
            previous_blank_or_code = True
        else:
            prose.append(line)
            previous_blank_or_code = not line.strip()
    return code, "\n".join(prose)


def _line_of(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def _inline_code(path: Path, text: str) -> Iterator[Snippet]:
    _, prose = _split(text)
    for m in INLINE_CODE.finditer(prose):
        if "\n\n" not in m.group(2):  # a span never crosses a paragraph
            yield Snippet(path, _line_of(prose, m.start()), " ".join(m.group(2).split()))


def _code_lines(path: Path, text: str) -> Iterator[Snippet]:
    code, _ = _split(text)
    for n, line in code:
        yield Snippet(path, n, line.strip())


def github_slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped (letters, digits, `_`,
    `-` and spaces kept), each space a `-` (github-slugger, which GitHub's renderer uses)."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading: its text
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


@cache
def _anchors(path: Path) -> frozenset[str]:
    return _anchors_in(path.read_text())


def _anchors_in(text: str) -> frozenset[str]:
    _, prose = _split(text)
    seen: dict[str, int] = {}
    anchors = set()
    for line in prose.splitlines():
        m = HEADING.match(line)
        if not m:
            continue
        slug = github_slug(m.group(2))
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        anchors.add(slug if count == 0 else f"{slug}-{count}")
    return frozenset(anchors)


def _link_problems(path: Path, text: str) -> Iterator[str]:
    _, prose = _split(text)
    masked = INLINE_CODE.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), prose)  # links in code are not links
    targets = [(m.start(), m.group(1)) for m in LINK.finditer(masked)]
    targets += [(m.start(), m.group(1)) for m in REFERENCE_LINK.finditer(masked)]
    for offset, target in targets:
        where = f"{path.relative_to(ROOT)}:{_line_of(masked, offset)}"
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto: ...
            continue
        file_part, _, anchor = target.partition("#")
        resolved = (path.parent / urllib.parse.unquote(file_part)).resolve() if file_part else path
        anchors = _anchors(resolved) if file_part and resolved.suffix == ".md" and resolved.is_file() else None
        if not file_part:
            anchors = _anchors_in(text)
        if not resolved.is_relative_to(ROOT):
            yield f"{where}: link {target!r} leaves the repository"
        elif not resolved.exists():
            yield f"{where}: link {target!r}: {resolved.relative_to(ROOT)} does not exist"
        elif anchor and anchors is not None and urllib.parse.unquote(anchor) not in anchors:
            known = ", ".join(sorted(anchors))
            yield f"{where}: link {target!r}: no heading #{anchor} in {resolved.relative_to(ROOT)} (its anchors: {known})"


# --- commands --------------------------------------------------------------------------


def _tokens(text: str) -> list[str]:
    text = re.sub(r"\s+#\s.*$", "", text)  # a shell comment after the command
    try:
        tokens = shlex.split(text)
    except ValueError:  # an unbalanced quote in a fragment: words are enough here
        tokens = text.split()
    while tokens and re.match(r"^[A-Z_][A-Z0-9_]*=", tokens[0]):  # VAR=value before the command
        tokens.pop(0)
    if tokens[:1] == ["$"]:
        tokens.pop(0)
    return [t.strip("[]()") for t in tokens]


def _is_flag(token: str) -> bool:
    return token.startswith("-") and len(token) > 1 and not re.match(r"^-\d", token) and token != "--"


@cache
def _cdc() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """The `cdc` command's parser (cdc_cli/main.py `build_parser`) and its subcommands' parsers."""
    parser = build_parser()
    subcommands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return parser, dict(subcommands.choices)


@cache
def _help_parses(subcommand: str) -> str | None:
    """None when `cdc <subcommand> --help` prints its help and exits 0, else what went wrong."""
    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            build_parser().parse_args([subcommand, "--help"])
    except SystemExit as exc:
        if exc.code == 0 and subcommand in out.getvalue():
            return None
        return f"exit {exc.code}: {err.getvalue().strip()}"
    return "printed no help"


def _cdc_problems(snippet: Snippet, args: list[str]) -> Iterator[str]:
    parser, subs = _cdc()
    if not args or PLACEHOLDER.match(args[0]):
        return
    head = args[0]
    if _is_flag(head):
        if head.split("=")[0] not in parser._option_string_actions:
            yield f"{snippet.where()}: `{snippet.text}`: cdc has no option {head}"
        return
    if head not in subs:
        yield f"{snippet.where()}: `{snippet.text}`: cdc has no subcommand {head!r} (its subcommands: {', '.join(subs)})"
        return
    problem = _help_parses(head)
    if problem:
        yield f"{snippet.where()}: `{snippet.text}`: `cdc {head} --help` fails: {problem}"
    known = subs[head]._option_string_actions
    for token in args[1:]:
        flag = token.split("=")[0]
        if _is_flag(flag) and flag not in known:
            flags = ", ".join(sorted(f for f in known if f.startswith("--")))
            yield f"{snippet.where()}: `{snippet.text}`: cdc {head} has no flag {flag} (its flags: {flags})"


@cache
def _run_sh_commands() -> frozenset[str]:
    """The commands of run.sh's `case "$cmd" in` (its `*)` prints the usage)."""
    text = (ROOT / "run.sh").read_text()
    body = text[text.index('case "$cmd" in') :]
    return frozenset(re.findall(r"^\s+([a-z]+)\)", body, re.MULTILINE))


@cache
def _bench_flags(name: str) -> frozenset[str]:
    """The option strings a bench script's argparse parser declares (read from its source:
    importing a benchmark would load the lab servers' modules for nothing)."""
    tree = ast.parse((ROOT / "bench" / f"{name}.py").read_text())
    flags = {"-h", "--help"}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "add_argument":
            flags |= {a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)}
    return frozenset(flags)


def _run_sh_problems(snippet: Snippet, args: list[str]) -> Iterator[str]:
    if not args or PLACEHOLDER.match(args[0]):
        return
    command, rest = args[0], args[1:]
    if command not in _run_sh_commands():
        yield f"{snippet.where()}: `{snippet.text}`: run.sh has no command {command!r} (its commands: {', '.join(sorted(_run_sh_commands()))})"
    elif command == "cdc":
        yield from _cdc_problems(snippet, rest)
    elif command == "demo":
        yield from _cdc_problems(snippet, ["demo", *rest])
    elif command == "bench" and rest and not PLACEHOLDER.match(rest[0]):
        name = rest[0]
        if not (ROOT / "bench" / f"{name}.py").is_file():
            yield f"{snippet.where()}: `{snippet.text}`: no benchmark bench/{name}.py"
            return
        for token in rest[1:]:
            flag = token.split("=")[0]
            if _is_flag(flag) and flag not in _bench_flags(name):
                yield f"{snippet.where()}: `{snippet.text}`: bench/{name}.py has no flag {flag}"
    elif command == "test":
        for token in rest:
            path = token.split("::")[0]
            if path.endswith(".py") and not (ROOT / path).is_file():
                yield f"{snippet.where()}: `{snippet.text}`: no test file {path}"


def _command_problems(snippet: Snippet) -> Iterator[str]:
    args = _tokens(snippet.text)
    if len(args) < 2:
        return
    if args[0] in ("cdc", ".venv/bin/cdc"):
        yield from _cdc_problems(snippet, args[1:])
    elif args[0] == "./run.sh":
        yield from _run_sh_problems(snippet, args[1:])


@cache
def _top_directories() -> tuple[str, ...]:
    """The repository's own top-level directories (not the venvs, build output or var/)."""
    return tuple(
        f"{d.name}/"
        for d in sorted(ROOT.iterdir())
        if d.is_dir()
        and not d.name.startswith((".", "var", "build", "dist", "__"))
        and not d.name.endswith(".egg-info")
        and not (d / "pyvenv.cfg").exists()
    )


def _path_problems(snippet: Snippet) -> Iterator[str]:
    relative_to = [ROOT, ROOT / "tests"] if snippet.path == ROOT / "tests" / "README.md" else [ROOT]
    for word in snippet.text.split():
        path = word.strip("`,;:()[]'\"").split("::")[0]
        if "<" in path or not re.search(r"\.(py|md|toml|sh|yml|yaml|avsc|json)$|/$", path):
            continue
        if not path.startswith(_top_directories()) and not (
            len(relative_to) > 1 and path.startswith(("unit/", "integration/"))
        ):
            continue
        if not any(list(base.glob(path.rstrip("/"))) for base in relative_to):
            yield f"{snippet.where()}: `{snippet.text}`: {path} does not exist"


def _snippets() -> Iterator[Snippet]:
    for path in DOC_FILES:
        text = path.read_text()
        yield from _code_lines(path, text)
        yield from _inline_code(path, text)


# --- the tests ---------------------------------------------------------------------------


def test_the_docs_exist():
    names = {p.relative_to(ROOT).as_posix() for p in DOC_FILES}
    assert {"README.md", "tests/README.md", "docs/DESIGN.md", "docs/operating.md"} <= names, names


def test_every_relative_link_resolves_to_a_file_and_a_heading():
    problems = [p for path in DOC_FILES for p in _link_problems(path, path.read_text())]
    assert not problems, "broken links:\n" + "\n".join(problems)


def test_every_command_shown_names_a_real_subcommand_flag_or_benchmark():
    snippets = list(_snippets())
    problems = [p for s in snippets for p in _command_problems(s)]
    assert not problems, "commands the project does not have:\n" + "\n".join(problems)
    # the check saw the commands it is for (a parser change that hid them all would pass silently)
    shown = {" ".join(_tokens(s.text)[:2]) for s in snippets}
    assert {"cdc run", "cdc verify", "cdc adopt", "./run.sh bench", "./run.sh test"} <= shown, shown


def test_every_repository_path_named_exists():
    snippets = list(_snippets())
    problems = [p for s in snippets for p in _path_problems(s)]
    assert not problems, "paths that do not exist:\n" + "\n".join(problems)
    assert "cdc/" in _top_directories() and "tests/" in _top_directories(), _top_directories()


def test_each_cdc_subcommand_answers_help():
    problems = {name: _help_parses(name) for name in _cdc()[1]}
    assert not any(problems.values()), problems


def test_the_readme_opens_with_the_demo_and_the_test_command():
    """CI and the team rely on it: one command runs the demo, one runs the tests."""
    lines = [line.strip() for line in (ROOT / "README.md").read_text().splitlines()[:6] if line.strip()]
    commands = [line.split("#")[0].strip() for line in lines if line.startswith("./run.sh")]
    assert commands[:2] == ["./run.sh demo", "./run.sh test"], lines


def test_every_complete_relay_toml_shown_loads():
    """A `toml` block with [source], [[outbox.tables]] and [kafka] is a whole relay.toml: it
    loads with the relay's own loader (secrets' variables and files stand in)."""
    blocks = 0
    for path in DOC_FILES:
        for m in re.finditer(r"^```toml\n(.*?)^```", path.read_text(), re.DOTALL | re.MULTILINE):
            text = m.group(1)
            if not all(s in text for s in ("[source]", "[[outbox.tables]]", "[kafka]")):
                continue
            blocks += 1
            where = f"{path.relative_to(ROOT)}:{_line_of(path.read_text(), m.start())}"
            env = {name: "user:secret" for name in re.findall(r'_env"?\s*=\s*"([A-Z0-9_]+)"', text)}
            try:
                load_config(tomllib.loads(text), env=env, read_file=lambda _path: "secret")
            except Exception as exc:
                raise AssertionError(f"{where}: the relay.toml shown does not load: {exc}") from None
    assert blocks >= 2, "expected the README's minimal relay.toml and the production example"


# --- the checker itself --------------------------------------------------------------------


def test_github_slugs():
    assert github_slug("Running two instances (one active relay)") == "running-two-instances-one-active-relay"
    assert github_slug("Switching over: `cdc adopt`") == "switching-over-cdc-adopt"
    assert github_slug("Property by property (Debezium name -> relay.toml)") == (
        "property-by-property-debezium-name---relaytoml"
    )
    assert github_slug("Debezium's converter and router properties") == "debeziums-converter-and-router-properties"


def test_the_checker_finds_a_broken_link_a_missing_anchor_a_wrong_flag_and_a_missing_benchmark():
    doc = ROOT / "docs" / "operating.md"  # the text below, as if it were this file
    text = "\n".join(
        [
            "# Title",
            "",
            "See [gone](nothing-here.md) and [anchor](../README.md#no-such-heading) and [ok](#title).",
            "A link in code is none: `[x](nowhere.md)`; a path is checked: `connectors/no_such_module.py`.",
            "Run `cdc verify --config relay.toml --folow` or `cdc frobnicate`, or `cdc verify --config",
            "relay.toml --follow --grace 5` (a span across lines).",
            "",
            "    ./run.sh bench nosuchbench --events 10",
            "    ./run.sh bench catchup --no-such-flag   # a comment --not-a-flag",
            "    ./run.sh frob",
            "",
            "```",
            "CDC_FAULT_LONG=1 ./run.sh test tests/unit/no_such_test.py -m fault",
            "```",
        ]
    )
    links = list(_link_problems(doc, text))
    commands = [p for s in [*_code_lines(doc, text), *_inline_code(doc, text)] for p in _command_problems(s)]
    assert any("docs/operating.md:3" in p and "nothing-here.md does not exist" in p for p in links), links
    assert any("docs/operating.md:3" in p and "no heading #no-such-heading in README.md" in p for p in links), links
    assert len(links) == 2, links
    assert any("docs/operating.md:5" in p and "cdc verify has no flag --folow" in p for p in commands), commands
    assert any("docs/operating.md:5" in p and "no subcommand 'frobnicate'" in p for p in commands), commands
    assert any("docs/operating.md:8" in p and "no benchmark bench/nosuchbench.py" in p for p in commands), commands
    assert any("docs/operating.md:9" in p and "bench/catchup.py has no flag --no-such-flag" in p for p in commands)
    assert any("docs/operating.md:10" in p and "run.sh has no command 'frob'" in p for p in commands), commands
    assert any("docs/operating.md:13" in p and "no test file tests/unit/no_such_test.py" in p for p in commands)
    assert len(commands) == 6, commands
    paths = [p for s in _inline_code(doc, text) for p in _path_problems(s)]
    assert paths == ["docs/operating.md:4: `connectors/no_such_module.py`: connectors/no_such_module.py does not exist"]
