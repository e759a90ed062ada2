"""Documented outputs against actual ones: what differs (figure by figure), and the
documented selection rewritten from the actual output.

Text outputs are compared line by line; an abridged one keeps some lines of the output in
their order. A documented line is paired with the next actual line that equals it, else with
the next one that equals it up to its numbers (so a changed figure is reported as a changed
figure, not as a missing line). JSON outputs are compared as data: an abridged one keeps some
keys and list items (items with ``engine`` and ``dcp_size`` are paired by those, strings like
text lines), and a float is compared at the decimals the page shows.
"""

from __future__ import annotations

import difflib
import json
import re

NUMBER = re.compile(r"\d[\d,]*(?:\.\d+)?")


def _pattern(line: str) -> re.Pattern:
    parts = NUMBER.split(line)
    return re.compile("^" + r"\d[\d,]*(?:\.\d+)?".join(map(re.escape, parts)) + "$")


def numbers_differ(doc: str, act: str) -> str:
    """'1.09 -> 1.12, 152,969 -> 150,490' for two lines equal up to their numbers."""
    pairs = [(a, b) for a, b in zip(NUMBER.findall(doc), NUMBER.findall(act), strict=False)
             if a != b]
    return ", ".join(f"{a} -> {b}" for a, b in pairs) or "spacing"


SIMILAR = 0.6      # difflib ratio above which a reworded line still stands for the documented one


def pair_lines(doc: list[str], act: list[str]) -> list[tuple[str, str | None]]:
    """Each documented line with the actual line it stands for (None: not in the output): the
    next equal line, else the next one equal up to its numbers, else the most similar one
    after it (a reworded reason), in order."""
    out, at = [], 0
    for d in doc:
        rest = range(at, len(act))
        k = next((k for k in rest if act[k] == d), None)
        if k is None:
            k = next((k for k in rest if _pattern(d).match(act[k])), None)
        if k is None:
            ratios = [(difflib.SequenceMatcher(None, d, act[k]).ratio(), -k) for k in rest]
            best = max(ratios, default=(0.0, 0))
            k = -best[1] if best[0] >= SIMILAR else None
        if k is None:
            out.append((d, None))
        else:
            out.append((d, act[k]))
            at = k + 1
    return out


def _lines(text: str) -> list[str]:
    return [x.rstrip() for x in text.strip("\n").split("\n")]


def text_problems(doc: str, act: str, abridged: bool) -> tuple[list[str], str | None]:
    """(what differs, the documented text rewritten from ``act``, or None when a documented
    line has no counterpart and the page must be edited by hand)."""
    d, a = _lines(doc), _lines(act)
    if not abridged:
        if d == a:
            return [], doc
        problems = []
        for k in range(max(len(d), len(a))):
            x = d[k] if k < len(d) else "<none>"
            y = a[k] if k < len(a) else "<none>"
            if x != y:
                problems.append(f"line {k + 1}: documented {x!r}, now {y!r}")
        return problems[:8], "\n".join(a)
    problems, new = [], []
    for dl, al in pair_lines(d, a):
        if al is None:
            problems.append(f"documented line not in the output: {dl!r}")
            new.append(dl)
        elif al != dl:
            problems.append(f"{numbers_differ(dl, al)} in {dl!r}")
            new.append(al)
        else:
            new.append(dl)
    fixable = not any(p.startswith("documented line not in") for p in problems)
    return problems, "\n".join(new) if fixable else None


# ---------------------------------------------------------------- JSON
def _decimals(x: float, shown: str | None) -> int | None:
    if shown is None or "." not in shown or "e" in shown.lower():
        return None
    return len(shown.split(".")[1])


def _display_places(x: float) -> int:
    """Decimals a page shows of a new float: 2 from 1 up, 4 below (944.84, 0.1075)."""
    return 2 if abs(x) >= 1 else 4


def project(doc, act, display: bool = False):
    """``act`` cut to the shape of ``doc``: the same keys, the paired list items, floats
    rounded to the decimals ``doc`` shows (``display``: at least the page's usual ones, for
    writing a changed value). A key or item ``act`` lacks is left out."""
    if isinstance(doc, dict) and isinstance(act, dict):
        return {k: project(v, act[k], display) for k, v in doc.items() if k in act}
    if isinstance(doc, list) and isinstance(act, list):
        return [project(d, a, display) for d, a in _pair_items(doc, act) if a is not None]
    if isinstance(doc, float) and isinstance(act, (int, float)) and not isinstance(act, bool):
        places = _decimals(doc, repr(doc))
        if places is None:
            return act
        if display and round(float(act), places) != doc:
            places = max(places, _display_places(float(act)))
        return round(float(act), places)
    return act


def _pair_items(doc: list, act: list) -> list[tuple]:
    def key(x):
        return (x.get("engine"), x.get("dcp_size")) if isinstance(x, dict) else None

    if all(isinstance(d, dict) and key(d) != (None, None) for d in doc):
        by = {key(a): a for a in act if isinstance(a, dict)}
        return [(d, by.get(key(d))) for d in doc]
    if all(isinstance(d, str) for d in doc) and all(isinstance(a, str) for a in act):
        return pair_lines(doc, act)
    if len(doc) == len(act):
        return list(zip(doc, act, strict=True))
    return [(d, act[k] if k < len(act) else None) for k, d in enumerate(doc)]


def json_diff(doc, new, path: str = "") -> list[str]:
    """What differs between the documented JSON and its projection of the actual answer."""
    if isinstance(doc, dict) and isinstance(new, dict):
        out = []
        for k, v in doc.items():
            p = f"{path}.{k}" if path else k
            out += [f"{p}: not in the answer"] if k not in new else json_diff(v, new[k], p)
        return out
    if isinstance(doc, list) and isinstance(new, list):
        out = [f"{path}: {len(doc)} items documented, {len(new)} paired in the answer"] \
            if len(doc) != len(new) else []
        for k, (d, n) in enumerate(zip(doc, new, strict=False)):
            out += json_diff(d, n, f"{path}[{k}]")
        return out
    if doc != new:
        if isinstance(doc, str) and isinstance(new, str) and _pattern(doc).match(new):
            return [f"{path}: {numbers_differ(doc, new)} in {doc!r}"]
        return [f"{path}: documented {json.dumps(doc)}, now {json.dumps(new)}"]
    return []


def json_problems(doc: str, act: str, abridged: bool) -> tuple[list[str], str | None]:
    try:
        d = json.loads(doc)
    except json.JSONDecodeError as exc:
        return [f"the documented output is not JSON ({exc})"], None
    try:
        a = json.loads(act)
    except json.JSONDecodeError:
        return [f"the answer is not JSON: {act[:200]!r}"], None
    new = project(d, a) if abridged else a
    problems = json_diff(d, new)
    if not abridged:
        problems += [f"{k}: not documented" for k in (a if isinstance(a, dict) else {})
                     if isinstance(d, dict) and k not in d]
    if abridged and any(": not in the answer" in p or " paired in the answer" in p
                        for p in problems):
        return problems, None      # an item or key the answer lacks: the page needs a hand
    return problems, dumps(project(d, a, display=True) if abridged else a)


# ---------------------------------------------------------------- compact JSON layout
WIDTH = 100


def _flat(v) -> str:
    return json.dumps(v, ensure_ascii=False, separators=(", ", ": "))


def _value(v, col: int, base: int) -> str:
    """``v`` written from column ``col`` on a line indented ``base``: on one line when it
    fits; else a list of numbers and short strings, or a dict, flows after its bracket with
    wrapped lines aligned one past it; any other list has one item per line."""
    flat = _flat(v)
    if col + len(flat) <= WIDTH or not isinstance(v, (dict, list)) or not v:
        return flat
    if isinstance(v, dict):
        return _flow([(json.dumps(k, ensure_ascii=False) + ": ", x) for k, x in v.items()],
                     "{", "}", col)
    if all(not isinstance(x, (dict, list)) and len(_flat(x)) < WIDTH // 3 for x in v):
        return _flow([("", x) for x in v], "[", "]", col)
    pad = base + 2
    return ("[\n" + ",\n".join(" " * pad + _value(x, pad, pad) for x in v) + "\n"
            + " " * base + "]")


def _flow(items: list[tuple[str, object]], opening: str, closing: str, col: int) -> str:
    lines: list[tuple[int, str]] = []     # (indent, text); the first line's is the caller's
    indent, cur = 0, opening
    for k, (head, val) in enumerate(items):
        sep = "," if k < len(items) - 1 else closing
        gap = "" if cur == opening and not lines else " "
        at = (col if not lines else indent) + len(cur) + len(gap)
        line_base = col if not lines else indent
        text = head + _value(val, at + len(head), line_base)
        if gap and at + len(text.split("\n")[0]) + len(sep) > WIDTH:
            lines.append((indent, cur))
            indent, cur, gap = col + 1, "", ""
            text = head + _value(val, indent + len(head), indent)
        cur += gap + text + sep
        if "\n" in text:               # a nested value over several (whole) lines
            first, *rest = cur.split("\n")
            lines.append((indent, first))
            lines += [(0, x) for x in rest[:-1]]
            indent, cur = 0, rest[-1]
    lines.append((indent, cur))
    return "\n".join((" " * i if n else "") + t for n, (i, t) in enumerate(lines))


def dumps(v) -> str:
    """A JSON answer laid out for a page: top-level keys one per line, values compact."""
    if not isinstance(v, dict):
        return _value(v, 0, 0)
    rows = []
    for k, (key, val) in enumerate(v.items()):
        head = f'  {json.dumps(key, ensure_ascii=False)}: '
        rows.append(head + _value(val, len(head), 2) + ("," if k < len(v) - 1 else ""))
    return "{\n" + "\n".join(rows) + "\n}"
