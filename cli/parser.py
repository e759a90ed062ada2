"""The command line's argument parser: argparse, with errors a user can act on.

- An unknown flag is reported before anything else (a missing required flag included), with
  the closest valid flag of that command: ``--ouput-tokens`` is not a missing
  ``--output-tokens``.
- Errors print the usage of the command that failed (``engine-advisor recommend ...``), never
  the top-level usage for a subcommand's flag.

Subparsers are this class too (argparse's ``add_subparsers`` uses the parent's class), so
every command gets it (stdlib only).
"""

from __future__ import annotations

import argparse
import difflib
import re
import sys

_NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+$")
_SYNONYMS = {"count": "num", "number": "num", "n": "num", "nr": "num"}


def _words(flag: str) -> frozenset[str]:
    """A flag's words, singular, with synonyms merged: --gpu-count and --num-gpus agree."""
    out = set()
    for w in flag.lstrip("-").lower().split("-"):
        w = _SYNONYMS.get(w, w)
        out.add(w[:-1] if len(w) > 3 and w.endswith("s") else w)
    return frozenset(out)


def closest(flag: str, options: list[str]) -> str | None:
    """The valid flag ``flag`` most likely meant: the same words in another order or
    wording, else the nearest spelling (difflib), else None."""
    same = [o for o in options if _words(o) == _words(flag)]
    if same:
        return same[0]
    near = difflib.get_close_matches(flag, options, n=1, cutoff=0.6)
    return near[0] if near else None
_OWNER = "_cli_parser"      # namespace attribute: the innermost parser that parsed the line


class CliParser(argparse.ArgumentParser):
    _argv: list[str] = []

    def parse_known_args(self, args=None, namespace=None):
        self._argv = list(sys.argv[1:] if args is None else args)
        namespace = namespace if namespace is not None else argparse.Namespace()
        setattr(namespace, _OWNER, self)   # a subcommand's parser overwrites it later
        return super().parse_known_args(self._argv, namespace)

    def parse_args(self, args=None, namespace=None):
        ns, extras = self.parse_known_args(args, namespace)
        owner = getattr(ns, _OWNER, self)
        if hasattr(ns, _OWNER):
            delattr(ns, _OWNER)
        if extras:
            owner.error(owner.unknown_message(extras) or
                        f"unrecognized arguments: {' '.join(extras)}")
        return ns

    def error(self, message: str):
        """Print this command's usage and the error, the unknown flags first; exit 2."""
        if not self._has_subcommands():
            message = self.unknown_message(self._argv) or message
        self.print_usage(sys.stderr)
        self.exit(2, f"{self.prog}: error: {message}\n")

    def _has_subcommands(self) -> bool:
        return any(isinstance(a, argparse._SubParsersAction) for a in self._actions)

    def _long_options(self) -> list[str]:
        return [s for s in self._option_string_actions if s.startswith("--")]

    def unknown_flags(self, argv: list[str]) -> list[str]:
        """The flags in ``argv`` that are none of this command's (nor a unique prefix)."""
        known = self._option_string_actions
        out = []
        for tok in argv:
            if tok == "--":
                break
            if not tok.startswith("-") or tok == "-" or _NUMBER.match(tok):
                continue
            name = tok.split("=", 1)[0]
            if name in known:
                continue
            if name.startswith("--") and any(s.startswith(name) for s in self._long_options()):
                continue          # an abbreviation: argparse resolves (or refuses) it
            out.append(name)
        return out

    def unknown_message(self, argv: list[str]) -> str | None:
        """'unrecognized argument: --ouput-tokens (did you mean --output-tokens?)', or None."""
        flags = self.unknown_flags(argv)
        if not flags:
            return None
        parts = []
        for f in flags:
            close = closest(f, self._long_options())
            parts.append(f"{f} (did you mean {close}?)" if close else f)
        noun = "argument" if len(flags) == 1 else "arguments"
        return f"unrecognized {noun}: {', '.join(parts)}"
