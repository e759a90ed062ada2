"""Service test fixtures (defined in svc_helpers.py)."""

from svc_helpers import artifact_dir, client, start_server  # noqa: F401
