"""One page against the code: what differs, and the page rewritten from the code (the test
reports the first, ``update`` writes the second)."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import re
from dataclasses import dataclass, field
from pathlib import Path

from . import compare
from .figures import FIGURES, Premise
from .markers import (
    BARE_CLI,
    PYTHON,
    ROOT,
    SHELL,
    Block,
    Page,
    bare,
    kind,
    python_modules,
    read,
    rel,
    rewrite,
    runs,
    shell_lines,
    split_chain,
)
from .run import Server, Workspace, parses, run_example, unwrap_optional

UPDATE = ".venv/bin/python -m tests.docs.update"
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
INSTALL = "python3 -m venv .venv && .venv/bin/pip install -e ."      # the README's install
# an inline command that runs this project's code (its modules, tests, scripts, install) or a
# tool of its venv with arguments must name the venv's program; a prose mention of a command
# (`engine-advisor serve`, `lint-imports`) is its name, not checked
OURS = re.compile(r"engine_advisor|-m tests\b|(^|\s)bench/|-e +'?\.|engine-advisor\[")
VENV_TOOLS = {"pytest", "mkdocs", "ruff", "lint-imports"}
GPU_MACHINE = "bench/real_engines/run.py"   # stdlib only: the GPU machine's own python3 runs it
SPAN = re.compile(r"(?<!`)`([^`]+)`(?!`)")


@dataclass
class Context:
    server: Server
    workspace: Workspace = field(default_factory=Workspace)

    def close(self) -> None:
        self.server.close()
        self.workspace.close()


@dataclass
class Report:
    page: str
    problems: list[str] = field(default_factory=list)
    manual: list[str] = field(default_factory=list)    # what only an edit by hand can fix
    text: str = ""                                       # the page rewritten from the code

    def add(self, where: str, what: str, fixable: bool = True) -> None:
        line = f"{self.page}:{where}: {what}"
        self.problems.append(line)
        if not fixable:
            self.manual.append(line)


def check_page(path: Path, ctx: Context) -> Report:
    page = read(path)
    rep = Report(page.name)
    outputs: dict[int, str] = {}
    last_example: tuple[Block, object] | None = None
    for k, b in enumerate(page.blocks):
        shell, python = b.lang in SHELL, b.lang in PYTHON
        cmds = b.commands() if shell else []
        where = f"{b.line} ({b.label()!r})"
        if b.mark is None and (python or any(runs(c) for c in cmds)):
            rep.add(where, "a block a user would run needs <!--example--> or "
                    "<!--illustrative:why--> on the line before it", fixable=False)
        for problem in bare_problems(b, cmds) if shell else []:
            rep.add(where, problem, fixable=False)
        for c in cmds:
            for problem in consistency(c) + module_problems(c):
                rep.add(where, problem, fixable=False)
        if python:
            for problem in import_problems(b.body):
                rep.add(where, problem, fixable=False)
        if b.mark == "illustrative":
            for c in cmds:
                if kind(c) == "cli" and "..." not in c:
                    err = parses(unwrap_optional(c))
                    if err:
                        rep.add(where, f"`{' '.join(c)}` no longer parses: {err}",
                                fixable=False)
        elif b.mark == "example":
            if not (python or any(runs(c) for c in cmds)):
                rep.add(where, "an example without a command to run", fixable=False)
                last_example = None
                continue
            result = run_example(b, ctx.server, ctx.workspace)
            if result.code != 0:
                rep.add(where, f"failed (exit {result.code}) as a user runs it from the "
                        f"repository root after `{INSTALL}`: "
                        f"{(result.err or result.out).strip()[-400:]}", fixable=False)
            last_example = (b, result) if result.code == 0 else None
        elif b.mark == "output":
            if last_example is None:
                rep.add(str(b.line), "an <!--output--> block without a working example "
                        "before it", fixable=False)
                continue
            example, result = last_example
            abridged = "abridged" in b.options
            fn = compare.json_problems if "json" in b.options else compare.text_problems
            problems, new = fn(b.body, result.out, abridged)
            for p in problems:
                rep.add(f"{b.line} (output of {example.label()!r})", p, fixable=new is not None)
            if new is not None and problems:
                outputs[k] = new
    gens = {}
    for g in page.gens:
        want = _figure(g.name, ctx, rep, str(g.line))
        if want is not None and want != g.text(page.lines):
            rep.add(str(g.line), f"generated {g.name!r} differs from the code: "
                    + _first_difference(g.text(page.lines), want))
            gens[g.name] = want
    figs = {}
    for name, shown, line in page.figures():
        want = _figure(name, ctx, rep, str(line))
        if want is not None and want.split() != shown.split():   # a figure may wrap lines
            rep.add(str(line), f"figure {name!r}: documented {shown!r}, now {want!r}")
            figs[name] = want
    for line, problem in dead_links(page.path, page.text):
        rep.add(str(line), problem, fixable=False)
    for line, problem in inline_problems(page):
        rep.add(str(line), problem, fixable=False)
    rep.text = rewrite(page, outputs, gens, figs)
    return rep


def _figure(name: str, ctx: Context, rep: Report, where: str) -> str | None:
    fn = FIGURES.get(name)
    if fn is None:
        rep.add(where, f"no figure {name!r} in tests/docs/figures.py", fixable=False)
        return None
    try:
        return fn(ctx)
    except Premise as exc:
        rep.add(where, f"figure {name!r}: the page's wording no longer holds: {exc}",
                fixable=False)
        return None


def _first_difference(doc: str, want: str) -> str:
    d, w = doc.split("\n"), want.split("\n")
    for k in range(max(len(d), len(w))):
        x = d[k] if k < len(d) else "<none>"
        y = w[k] if k < len(w) else "<none>"
        if x != y:
            return f"line {k + 1}: documented {x!r}, now {y!r}"
    return "whitespace"


def bare_problems(b: Block, cmds: list[list[str]]) -> list[str]:
    """A bare ``engine-advisor`` anywhere in a shell block (comments too), and outside an
    illustrative block a bare ``python``, ``pip`` or other program of the venv: after the
    README's install none of them is on PATH."""
    out = []
    if BARE_CLI.search(b.body):
        out.append("`engine-advisor` is not on PATH after the README's install "
                   f"(`{INSTALL}`): write .venv/bin/engine-advisor")
    if b.mark != "illustrative":
        for name in dict.fromkeys(n for n in map(bare, cmds) if n and n != "engine-advisor"):
            out.append(f"`{name}` is not the project's environment after the README's install "
                       f"(`{INSTALL}`): write .venv/bin/{'python' if name == 'python3' else name}")
    return out


def _module_exists(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ImportError:       # a parent that is a module, not a package, or does not exist
        return False


def module_problems(argv: list[str]) -> list[str]:
    """A ``python -m`` of this project's code must name a module that exists."""
    out = []
    for mod in python_modules(argv):
        if mod.split(".")[0] == "tests":
            path = ROOT.joinpath(*mod.split("."))
            found = path.with_suffix(".py").is_file() or (path / "__main__.py").is_file()
        elif mod.split(".")[0] == "engine_advisor":
            found = _module_exists(mod)
        else:
            continue
        if not found:
            out.append(f"`python -m {mod}`: no such module")
    return out


def import_problems(code: str) -> list[str]:
    """Python code's imports of this project's modules must resolve, names and all."""
    try:
        tree = ast.parse(code)
    except SyntaxError as exc:
        return [f"not Python: {exc.msg} (line {exc.lineno})"]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("engine_advisor"):
            try:
                mod = importlib.import_module(node.module)
            except ImportError as exc:
                out.append(f"from {node.module} import ...: {exc}")
                continue
            out += [f"from {node.module} import {a.name}: no such name" for a in node.names
                    if not hasattr(mod, a.name) and not _module_exists(f"{node.module}.{a.name}")]
        elif isinstance(node, ast.Import):
            out += [f"import {a.name}: no such module" for a in node.names
                    if a.name.startswith("engine_advisor") and not _module_exists(a.name)]
    return out


def inline_problems(page: Page) -> list[tuple[int, str]]:
    """Inline code outside fenced blocks that runs this project's code or a tool of its venv
    (``python -m engine_advisor...``, ``pip install -e .``, ``mkdocs build``) without the venv's
    path, a ``python -m`` of a module that does not exist, a ``python -c`` whose imports of
    the project do not resolve."""
    lines = list(page.lines)
    for b in page.blocks:
        lines[b.start - 1:b.end + 1] = [""] * (b.end - b.start + 2)
    text = "\n".join(lines)
    out = []
    for m in SPAN.finditer(text):
        span = " ".join(m.group(1).split())
        line = text.count("\n", 0, m.start()) + 1
        for tokens in shell_lines(span):
            for c in split_chain(tokens):
                name = bare(c)
                if name and name != "engine-advisor" and GPU_MACHINE not in c and (
                        (name in VENV_TOOLS and len(c) > 1) or OURS.search(" ".join(c))):
                    out.append((line, f"`{span}`: `{name}` is not the project's environment "
                                f"after the README's install (`{INSTALL}`): write "
                                f".venv/bin/{'python' if name == 'python3' else name}"))
                out += [(line, f"`{span}`: {p}") for p in module_problems(c)]
                if c and c[0].rsplit("/", 1)[-1].startswith("python") and "-c" in c[1:-1]:
                    code = c[c.index("-c") + 1]
                    out += [(line, f"`{span}`: {p}") for p in import_problems(code)]
    return out


def consistency(argv: list[str]) -> list[str]:
    """A command that names a preset model and its KV bytes must quote that preset's."""
    from engine_advisor.model.arch import PRESETS
    from engine_advisor.model.physics.shape import preset_shape

    def value(flag: str) -> str | None:
        for k, t in enumerate(argv):
            if t == flag and k + 1 < len(argv):
                return argv[k + 1]
            if t.startswith(flag + "="):
                return t.split("=", 1)[1]
        return None

    kv = value("--kv-bytes-per-token")
    name = next((v for v in map(value, ("--preset", "--model", "--model-name"))
                 if v and v.rsplit("/", 1)[-1].lower() in PRESETS), None)
    if not kv or not kv.isdigit() or not name:
        return []
    dtype = "fp8" if (value("--kv-cache-dtype") or "").startswith("fp8") else "bf16"
    want = preset_shape(name.rsplit("/", 1)[-1].lower(), dtype).kv_bytes_per_token
    if int(kv) != round(want):
        return [f"--kv-bytes-per-token {kv} is not {name}'s {want:,.0f} ({dtype})"]
    return []


def _anchors(path: Path) -> set[str]:
    """The heading anchors of a page (the slugs MkDocs' toc and GitHub give them)."""
    out = set()
    fenced = False
    for line in path.read_text(encoding="utf-8").split("\n"):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        m = None if fenced else re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            slug = re.sub(r"[^\w\s-]", "", m.group(1).lower().replace("`", ""))
            out.add(re.sub(r"[\s]+", "-", slug.strip()))
    return out


def dead_links(path: Path, text: str) -> list[tuple[int, str]]:
    """Relative links whose file or heading anchor does not exist."""
    out = []
    for m in LINK.finditer(text):
        target = m.group(1)
        if re.match(r"^[a-z]+:", target) or target.startswith("mailto:"):
            continue
        file, _, anchor = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        line = text.count("\n", 0, m.start()) + 1
        if not dest.exists():
            out.append((line, f"link to {target}: {rel(dest)} does not exist"))
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            out.append((line, f"link to {target}: no heading #{anchor} in {dest.name}"))
    return out
