"""openapi.yaml and the document a running service serves are valid OpenAPI, and every
``$ref`` in them points at something the document defines (client generators and schema
fuzzers skip or fail on an operation whose reference dangles)."""

from __future__ import annotations

from pathlib import Path

import httpx
import yaml
from openapi_spec_validator import validate

ROOT = Path(__file__).resolve().parents[2]


def refs(node, where: str = "#"):
    """Every (location, $ref value) in ``node``."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref" and isinstance(value, str):
                yield where, value
            else:
                yield from refs(value, f"{where}/{key.replace('~', '~0').replace('/', '~1')}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from refs(value, f"{where}/{i}")


def resolve(spec: dict, ref: str):
    """The node a local reference (``#/a/b``, RFC 6901 escapes) points at; KeyError if none."""
    if not ref.startswith("#/"):
        raise KeyError(f"not a local reference: {ref}")
    node = spec
    for part in ref[2:].split("/"):
        part = part.replace("~1", "/").replace("~0", "~")
        node = node[int(part)] if isinstance(node, list) else node[part]
    return node


def dangling(spec: dict) -> list[str]:
    """'location: $ref' for every reference that points at nothing."""
    found = list(refs(spec))
    assert found, "a document without references: the walk found nothing"
    out = []
    for where, ref in found:
        try:
            resolve(spec, ref)
        except (KeyError, IndexError, ValueError):
            out.append(f"{where}: {ref}")
    return out


def check(spec: dict) -> None:
    missing = dangling(spec)
    assert not missing, "references to nothing:\n" + "\n".join(missing)
    validate(spec)


def test_the_reference_check_finds_a_dangling_reference():
    spec = yaml.safe_load((ROOT / "openapi.yaml").read_text(encoding="utf-8"))
    del spec["components"]["schemas"]["RouteWorkload"]
    assert dangling(spec) == ["#/paths/~1v1~1route/post/requestBody/content/application~1json/"
                              "schema/anyOf/1: #/components/schemas/RouteWorkload"]
    assert resolve(spec, "#/paths/~1v1~1route/post")["operationId"] == "route_request"


def test_openapi_yaml_is_valid_and_every_reference_resolves():
    spec = yaml.safe_load((ROOT / "openapi.yaml").read_text(encoding="utf-8"))
    check(spec)
    route_body = spec["paths"]["/v1/route"]["post"]["requestBody"]["content"]
    assert {"$ref": "#/components/schemas/RouteWorkload"} in \
        route_body["application/json"]["schema"]["anyOf"]
    assert spec["components"]["schemas"]["RouteWorkload"]["required"] == ["context_tokens"]


def test_served_openapi_json_is_valid_and_matches_the_file(start_server):
    server = start_server()
    r = httpx.get(f"{server.url}/openapi.json", timeout=30)
    assert r.status_code == 200, r.text
    served = r.json()
    check(served)
    assert served == yaml.safe_load((ROOT / "openapi.yaml").read_text(encoding="utf-8"))
