"""The what-if page: ``GET /ui`` (``/`` redirects there) and its static files.

The page is plain HTML + JS + CSS shipped in the package (service/ui/); it calls only the
public REST API. The choice lists (presets, GPUs, KV dtypes, vendors, engines) are rendered into the
page from the same catalogues that validate the workload, so they never drift from the API.
"""

from __future__ import annotations

import html
from functools import cache
from pathlib import Path
from typing import get_args

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from engine_advisor.model import engines
from engine_advisor.model.arch import PRESETS
from engine_advisor.model.hardware.gpus import BUILTIN_GPUS
from engine_advisor.model.kv import KvDtype
from engine_advisor.model.workload import Requirements
from engine_advisor.service.errors import ApiError

router = APIRouter(tags=["ui"], include_in_schema=False)

UI_DIR = Path(__file__).resolve().parent.parent / "ui"
JS = "text/javascript; charset=utf-8"
STATIC = {**{f"{m}.js": JS for m in ("app", "api", "chart", "dom", "form", "model", "plan",
                                      "recommend")},
          "app.css": "text/css; charset=utf-8", "favicon.svg": "image/svg+xml"}
# Everything from this origin, nothing from anywhere else (the page works offline).
CSP = ("default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
       "object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'")
HEADERS = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff",
           "Cache-Control": "no-cache"}


def _options(values, default: str | None = None, blank: str | None = None) -> str:
    out = [f'<option value="">{html.escape(blank)}</option>'] if blank is not None else []
    for v in values:
        sel = " selected" if v == default else ""
        out.append(f'<option value="{html.escape(v)}"{sel}>{html.escape(v)}</option>')
    return "".join(out)


def _engine_options() -> str:
    """The engines a workload may name: the default set (blank), every engine together, and
    each alone; an engine known by its priors only is marked so."""
    def label(name: str) -> str:
        e = engines.get(name)
        return e.label + (" (priors only)" if e.uncalibrated_note else "")

    every = engines.names()
    choices = [(",".join(every), ", ".join(label(n) for n in every))] if every != (
        engines.defaults()) else []
    choices += [(n, label(n)) for n in every]
    out = [f'<option value="">{html.escape(" and ".join(label(n) for n in engines.defaults()))}'
           "</option>"]
    out += [f'<option value="{html.escape(v)}">{html.escape(t)}</option>' for v, t in choices]
    return "".join(out)


@cache
def page() -> str:
    vendors = get_args(get_args(Requirements.model_fields["hardware_vendor"].annotation)[0])
    fill = {
        "{{PRESETS}}": _options(sorted(PRESETS), "kimi-k3"),
        "{{GPUS}}": _options(list(BUILTIN_GPUS), "B300"),
        "{{KV_DTYPES}}": _options(get_args(KvDtype), "bf16"),
        "{{VENDORS}}": _options(vendors, blank="any"),
        "{{ENGINES}}": _engine_options(),
    }
    text = (UI_DIR / "index.html").read_text(encoding="utf-8")
    for key, value in fill.items():
        text = text.replace(key, value)
    return text


@router.get("/", response_class=RedirectResponse)
async def root(request: Request) -> RedirectResponse:
    query = request.url.query
    return RedirectResponse("/ui" + (f"?{query}" if query else ""), status_code=307)


@router.get("/ui", response_class=HTMLResponse)
async def ui() -> HTMLResponse:
    return HTMLResponse(page(), headers=HEADERS)


@router.get("/ui/static/{name}")
async def static(name: str) -> Response:
    media = STATIC.get(name)
    if media is None:  # a fixed list: no path from the request ever reaches the file system
        raise ApiError(404, f"no static file {name!r}", param="name")
    return Response((UI_DIR / name).read_bytes(), media_type=media, headers=HEADERS)
