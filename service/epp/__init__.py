"""The Endpoint Picker (Gateway API Inference Extension): Envoy's ext_proc over gRPC.

``serving(app)`` is the app lifespan's hook: nothing when ``epp_port`` is unset; otherwise it
imports the gRPC parts (extra ``engine-advisor[epp]``) and serves them while the app runs.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

MISSING = ("--epp-port: needs the packages grpcio, grpcio-health-checking and xds-protos: "
           "pip install 'engine-advisor[epp]'")


def available() -> bool:
    """Whether the gRPC packages the picker needs are installed."""
    try:
        import grpc  # noqa: F401
        import grpc_health.v1.health  # noqa: F401
        from envoy.service.ext_proc.v3 import external_processor_pb2_grpc  # noqa: F401
    except ImportError:
        return False
    return True


@contextlib.asynccontextmanager
async def serving(app) -> AsyncIterator[None]:
    port = app.state.settings.epp_port
    if port is None:
        yield
        return
    if not available():
        raise RuntimeError(MISSING)
    from engine_advisor.service.epp.server import PickerServer
    from engine_advisor.service.epp.shared import open_counts

    counts = open_counts(app.state.settings.workers)
    server = PickerServer(app, app.state.settings.host, port, counts)
    try:
        await server.start()
        yield
    finally:
        await server.stop()
        counts.close()
