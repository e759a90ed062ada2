"""A documentation page as the docs test sees it: fenced blocks with their markers, inline
figures and generated regions, and how to write the page back with new contents."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MARK = re.compile(r"^<!--(example|output|illustrative)(?::([^>]*))?-->\s*$")
GEN_OPEN = re.compile(r"^<!--gen:([\w.-]+)-->\s*$")
GEN_CLOSE = "<!--/gen-->"
FIG = re.compile(r"<!--fig:([\w.-]+)-->(.*?)<!--/fig-->", re.S)
FENCE = re.compile(r"^(\s*)(```+)(\S*)\s*$")
CHAIN = {"&&", "||", ";", "|"}
SHELL = ("", "bash", "sh", "shell", "console")     # fenced blocks of shell commands
PYTHON = ("python", "py", "pycon")                  # fenced blocks of Python

# What a user types to run something: a command whose program is one of these (or a path to
# one, or a script) makes its block one that must say whether it is run or illustrative.
PROGRAMS = {"engine-advisor", "curl", "python", "python3", "pip", "pip3", "pytest", "mkdocs",
            "ruff", "lint-imports", "bash", "sh", "git", "apt-get", "vllm", "wrk"}
WRAPPERS = {"setsid", "nohup", "time", "exec", "env"}
# Not on PATH after the README's install (`python3 -m venv .venv && .venv/bin/pip install -e .`):
# the venv's programs are .venv/bin/NAME. `python3` itself is, for `python3 -m venv`.
VENV_ONLY = {"engine-advisor", "python", "pip", "pip3", "pytest", "mkdocs", "ruff",
             "lint-imports"}
# a bare engine-advisor subcommand anywhere in a block, comments included (not the package's
# name in `pip install 'engine-advisor[epp]'`, nor an error message's `engine-advisor: error`)
BARE_CLI = re.compile(r"(?<![\w/.\[-])engine-advisor(?= +[a-z])")


def pages() -> list[Path]:
    """The pages checked: the README and every page of the documentation site."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def rel(path: Path) -> str:
    """The page's path from the repository root (a page elsewhere: its full path)."""
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


@dataclass
class Block:
    """A fenced block: its body is ``lines[start:end]`` of the page (0-based)."""

    line: int                     # 1-based line of the opening fence
    lang: str
    start: int
    end: int
    body: str
    mark: str | None = None       # example | output | illustrative
    options: list[str] = field(default_factory=list)

    def commands(self) -> list[list[str]]:
        """The block's shell commands as argument lists, one per pipeline element."""
        out = []
        for tokens in shell_lines(self.body):
            out.extend(split_chain(tokens))
        return out

    def label(self) -> str:
        first = next((c for c in self.commands() if kind(c)), None)
        text = shlex.join(first) if first else self.body.strip().splitlines()[0]
        return text if len(text) <= 90 else text[:87] + "..."


@dataclass
class Gen:
    name: str
    start: int                    # lines[start:end] is the generated text
    end: int
    line: int                     # 1-based line of the opening marker

    def text(self, lines: list[str]) -> str:
        return "\n".join(lines[self.start:self.end])


@dataclass
class Page:
    path: Path
    text: str
    lines: list[str]
    blocks: list[Block]
    gens: list[Gen]

    @property
    def name(self) -> str:
        return rel(self.path)

    def figures(self) -> list[tuple[str, str, int]]:
        """(name, documented text, 1-based line) of each inline figure."""
        return [(m.group(1), m.group(2), self.text.count("\n", 0, m.start()) + 1)
                for m in FIG.finditer(self.text)]


def read(path: Path) -> Page:
    text = path.read_text(encoding="utf-8")
    lines = text.split("\n")
    blocks: list[Block] = []
    gens: list[Gen] = []
    open_gen: tuple[str, int] | None = None
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if m:
            fence = m.group(2)
            j = i + 1
            while j < len(lines) and not re.match(rf"^\s*{fence}\s*$", lines[j]):
                j += 1
            mark = MARK.match(lines[i - 1]) if i > 0 else None
            blocks.append(Block(line=i + 1, lang=m.group(3), start=i + 1, end=j,
                                body="\n".join(lines[i + 1:j]),
                                mark=mark.group(1) if mark else None,
                                options=[o for o in (mark.group(2) or "").split(":") if o]
                                if mark else []))
            i = j + 1
            continue
        g = GEN_OPEN.match(lines[i])
        if g:
            if open_gen:
                raise ValueError(f"{rel(path)}:{i + 1}: gen {g.group(1)} opens inside "
                                 f"gen {open_gen[0]}")
            open_gen = (g.group(1), i)
        elif lines[i].strip() == GEN_CLOSE:
            if not open_gen:
                raise ValueError(f"{rel(path)}:{i + 1}: {GEN_CLOSE} without an opening marker")
            gens.append(Gen(open_gen[0], open_gen[1] + 1, i, open_gen[1] + 1))
            open_gen = None
        i += 1
    if open_gen:
        raise ValueError(f"{rel(path)}:{open_gen[1] + 1}: gen {open_gen[0]} is never closed")
    return Page(path, text, lines, blocks, gens)


def shell_lines(body: str) -> list[list[str]]:
    """Commands of a shell block: continuation lines joined, comments dropped, a quote that
    spans lines kept whole."""
    out, buf = [], ""
    for line in body.replace("\\\n", " ").split("\n"):
        buf = f"{buf}\n{line}" if buf else line
        try:
            tokens = shlex.split(buf, comments=True)
        except ValueError:       # a quote still open: read on
            continue
        if tokens:
            out.append(tokens)
        buf = ""
    return out


def split_chain(tokens: list[str]) -> list[list[str]]:
    """``a && b | c`` -> [a, b, c]; leading VAR=value assignments and redirections dropped."""
    out, cur = [], []
    for t in [*tokens, "&&"]:
        if t in CHAIN:
            while cur and re.match(r"^[A-Z_][A-Z0-9_]*=", cur[0]):
                cur = cur[1:]
            if ">" in cur:
                cur = cur[:cur.index(">")]
            if cur:
                out.append(cur)
            cur = []
        else:
            cur.append(t)
    return out


def kind(argv: list[str]) -> str | None:
    """'cli' for an engine-advisor command, 'curl' for curl, else None."""
    exe = Path(argv[0]).name if argv else ""
    return {"engine-advisor": "cli", "curl": "curl"}.get(exe)


def program(argv: list[str]) -> list[str]:
    """The command without a wrapper or assignments in front (``setsid python3 x``,
    ``env A=1 python3 x`` -> ``python3 x``)."""
    while argv and (argv[0] in WRAPPERS or re.match(r"^[A-Z_][A-Z0-9_]*=", argv[0])):
        argv = argv[1:]
    return argv


def runs(argv: list[str]) -> bool:
    """Whether the command runs something a user would type: a known program (by name or
    path) or a script by its path."""
    argv = program(argv)
    if not argv:
        return False
    exe = argv[0]
    return (Path(exe).name in PROGRAMS or "/bin/" in exe or exe.startswith("./")
            or ("/" in exe and exe.endswith((".sh", ".py"))))


def bare(argv: list[str]) -> str | None:
    """The program's name when the command names a virtual environment's program without its
    path (``python -m x``, ``pip install y``), else None; ``python3 -m venv`` is fine."""
    argv = program(argv)
    if not argv or "/" in argv[0] or argv[0] not in VENV_ONLY | {"python3"}:
        return None
    if argv[0] == "python3" and argv[1:3] == ["-m", "venv"]:
        return None
    return argv[0]


def python_modules(argv: list[str]) -> list[str]:
    """The module a ``python -m MODULE`` command runs (none for other commands)."""
    argv = program(argv)
    if argv and Path(argv[0]).name.startswith("python") and "-m" in argv[1:-1]:
        return [argv[argv.index("-m", 1) + 1]]
    return []


def rewrite(page: Page, outputs: dict[int, str], gens: dict[str, str],
            figures: dict[str, str]) -> str:
    """The page with new block bodies (by block index), generated regions and figures."""
    lines = list(page.lines)
    spans = [(b.start, b.end, outputs[k]) for k, b in enumerate(page.blocks) if k in outputs]
    spans += [(g.start, g.end, gens[g.name]) for g in page.gens if g.name in gens]
    for start, end, new in sorted(spans, reverse=True):
        lines[start:end] = new.split("\n")
    text = "\n".join(lines)
    return FIG.sub(lambda m: (f"<!--fig:{m.group(1)}-->{figures[m.group(1)]}<!--/fig-->"
                              if m.group(1) in figures else m.group(0)), text)
