"""Helpers shared by CLI commands: loading the model, turning validation errors into messages."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from engine_advisor.cli.errors import CliError
from engine_advisor.model.errors import validation_message  # noqa: F401 - the commands import it from here
from engine_advisor.model.fit.artifact import ArtifactError, load
from engine_advisor.model.fit.costmodel import CostModel
from engine_advisor.model.fit.default import default_model


def load_model(path: str | None) -> CostModel:
    """The artifact at ``path``, or the embedded default model."""
    if not path:
        return default_model()
    try:
        return load(path)[0]
    except ArtifactError as exc:
        raise CliError(str(exc)) from None


def read_json_file(path: str, what: str) -> Any:
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise CliError(f"{what} {path}: cannot read ({exc.strerror})") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CliError(f"{what} {path}: not valid JSON ({exc})") from None
