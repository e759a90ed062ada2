"""Pydantic validation errors as one readable line, shared by every layer that reports them."""

from __future__ import annotations

from pydantic import ValidationError


def validation_message(exc: ValidationError, names: dict[str, str] | None = None,
                       limit: int | None = None) -> str:
    """'field.path: reason; ...' for each error (the first ``limit``); ``names`` renames
    top-level fields (CLI flags)."""
    out = []
    for err in exc.errors()[:limit]:
        loc = [str(p) for p in err["loc"]]
        name = (names or {}).get(loc[0], ".".join(loc)) if loc else ""
        msg = err["msg"].removeprefix("Value error, ")
        out.append(f"{name}: {msg}" if name else msg)
    return "; ".join(out)


class NoEligibleConfiguration(ValueError):
    """No configuration may be recommended (none calibrated, all excluded, or none holds one
    sequence); ``field`` names the workload field to blame."""

    field = "allow_extrapolation"


class DiskError(OSError):
    """A file that could not be written (or read) for a reason of the disk or the file system:
    a full disk, a read-only one, a missing permission, a folder where a file should be.
    ``str()`` is one line naming the path and the cause (``/data/m.json: cannot write (No
    space left on device)``, or ``/data/m.json: is a directory; not replacing it`` when
    ``strerror`` is None); the command line prints it as its error (exit 2). An OSError, with
    ``errno``, ``strerror`` and ``filename`` (the path) kept, so that code catching OSError still
    catches it."""

    def __init__(self, errno: int | None, strerror: str | None, filename: str,
                 doing: str = "cannot write"):
        super().__init__(errno, strerror, filename)
        self.doing = doing

    @classmethod
    def of(cls, path: object, exc: OSError, doing: str = "cannot write") -> DiskError:
        """``exc`` met while working on ``path`` (the path the user named: not a temp file)."""
        return cls(exc.errno, exc.strerror or str(exc), str(path), doing)

    def __str__(self) -> str:
        if self.strerror is None:       # the reason is all in ``doing`` ("is a directory")
            return f"{self.filename}: {self.doing}"
        return f"{self.filename}: {self.doing} ({self.strerror})"
