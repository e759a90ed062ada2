"""The REST service's OpenAPI document, generated from the app (``engine-advisor openapi``
writes it to ``openapi.yaml`` at the repository top, which the tests compare)."""

from __future__ import annotations

from pathlib import Path

DEFAULT_OPENAPI = Path(__file__).resolve().parent.parent / "openapi.yaml"


def openapi_yaml() -> str:
    import yaml

    from engine_advisor.service.main import create_app
    from engine_advisor.service.settings import Settings

    spec = create_app(Settings(_env_file=None)).openapi()
    return yaml.safe_dump(spec, sort_keys=False, allow_unicode=True, width=100)
