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
