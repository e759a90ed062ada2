"""One page against the code: what differs, and the page rewritten from the code (the test
reports the first, ``update`` writes the second)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from . import compare
from .figures import FIGURES, Premise
from .markers import Block, kind, read, rel, rewrite
from .run import Server, parses, run_cli, run_curl, unwrap_optional

UPDATE = "python -m tests.docs.update"
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")


@dataclass
class Context:
    server: Server


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
        cmds = [c for c in b.commands() if kind(c)] if b.lang in ("", "bash", "sh") else []
        where = f"{b.line} ({b.label()!r})"
        if b.mark is None and cmds:
            rep.add(where, "a block with engine-advisor or curl commands needs <!--example--> "
                    "or <!--illustrative:why--> on the line before it", fixable=False)
        for c in cmds:
            for problem in consistency(c):
                rep.add(where, problem, fixable=False)
        if b.mark == "illustrative":
            for c in cmds:
                if kind(c) == "cli" and "..." not in c:
                    err = parses(unwrap_optional(c))
                    if err:
                        rep.add(where, f"`{' '.join(c)}` no longer parses: {err}",
                                fixable=False)
        elif b.mark == "example":
            result = None
            for c in cmds:
                result = run_cli(c) if kind(c) == "cli" else run_curl(c, ctx.server)
                if result.code != 0:
                    rep.add(where, f"`{' '.join(c)}` failed (exit {result.code}): "
                            f"{(result.err or result.out).strip()[-400:]}", fixable=False)
                    break
            last_example = (b, result) if result is not None and result.code == 0 else None
            if not cmds:
                rep.add(where, "an example without engine-advisor or curl commands",
                        fixable=False)
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
