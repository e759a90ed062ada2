"""The /ui routes (in-process): the redirect, the page, its static files, nothing from outside."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from engine_advisor.model.arch import PRESETS
from engine_advisor.model.hardware.gpus import BUILTIN_GPUS
from engine_advisor.service.main import create_app
from engine_advisor.service.routes.ui import STATIC, UI_DIR
from engine_advisor.service.settings import Settings


@pytest.fixture(scope="module")
def client():
    with TestClient(create_app(Settings(_env_file=None)), follow_redirects=False) as c:
        yield c


def test_root_redirects_to_ui_keeping_the_query(client):
    r = client.get("/")
    assert r.status_code == 307 and r.headers["location"] == "/ui"
    r = client.get("/?context_tokens=204800&preset=kimi-k3")
    assert r.headers["location"] == "/ui?context_tokens=204800&preset=kimi-k3"


def test_page_lists_the_catalogues_and_forbids_other_origins(client):
    r = client.get("/ui")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    csp = r.headers["content-security-policy"]
    assert "default-src 'self'" in csp and "script-src 'self'" in csp
    page = r.text
    assert "{{" not in page
    for name in [*PRESETS, *BUILTIN_GPUS]:
        assert f'<option value="{name}"' in page
    assert '<option value="kimi-k3" selected>' in page


def test_static_files(client):
    for name, media in STATIC.items():
        r = client.get(f"/ui/static/{name}")
        assert r.status_code == 200 and r.headers["content-type"] == media
        assert r.content == (UI_DIR / name).read_bytes()
    for bad in ("index.html", "..%2Froutes%2Fui.py", "nope.js"):
        r = client.get(f"/ui/static/{bad}")
        assert r.status_code == 404 and r.json()["error"]["code"] == 404


def test_assets_reference_nothing_outside_the_service():
    """Every src/href/url()/fetch target in the shipped files is a path on this origin."""
    for f in sorted(Path(UI_DIR).iterdir()):
        text = f.read_text(encoding="utf-8")
        refs = re.findall(r'(?:src|href)="([^"]*)"|url\(([^)]*)\)|fetch\(([^,)]*)', text)
        for ref in (x for group in refs for x in group if x):
            assert not re.match(r"^\W*(https?:)?//", ref), (f.name, ref)


def test_ui_is_not_in_the_api_schema(client):
    paths = client.get("/openapi.json").json()["paths"]
    assert not any(p == "/" or p.startswith("/ui") for p in paths)


def test_page_lists_the_engines_a_workload_may_name(client):
    page = client.get("/ui").text
    # blank: the default set (vLLM and SGLang); TensorRT-LLM only when chosen, marked a prior
    assert '<select id="f-engines" name="engines" data-param="engines">' in page
    assert '<option value="">vLLM and SGLang</option>' in page
    assert ('<option value="vllm,sglang,trtllm">vLLM, SGLang, TensorRT-LLM (priors only)'
            '</option>') in page
    assert '<option value="trtllm">TensorRT-LLM (priors only)</option>' in page
