"""The gRPC server: ``envoy.service.ext_proc.v3.ExternalProcessor`` and ``grpc.health.v1``,
on the app's event loop (the decision reads the proxy's live state).

Health services, as the Endpoint Picker Protocol names them: ``liveness`` (the process
answers), ``readiness`` and ``envoy.service.ext_proc.v3.ExternalProcessor`` (pools are loaded
and the picker takes requests), and ``""`` (the server as a whole). All turn NOT_SERVING when
the service shuts down.
"""

from __future__ import annotations

import logging

import grpc
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ext_proc_grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from service.epp import decision
from service.epp.endpoints import Endpoints
from service.epp.exchange import Exchange

log = logging.getLogger("engine_advisor.epp")

EXT_PROC = "envoy.service.ext_proc.v3.ExternalProcessor"
SERVICES = ("", "liveness", "readiness", EXT_PROC)
GRACE_S = 5.0


class Picker(ext_proc_grpc.ExternalProcessorServicer):
    def __init__(self, app):
        self.app = app
        self.endpoints = Endpoints()

    async def Process(self, request_iterator, context):  # noqa: N802 (the gRPC method name)
        st = self.app.state
        ex = Exchange(st.proxy, st.holder.current, self.endpoints)
        async for out in ex.run(request_iterator):
            yield out


class PickerServer:
    def __init__(self, app, host: str, port: int):
        self.app, self.host, self.port = app, host, port
        self.server: grpc.aio.Server | None = None
        self.health = health.aio.HealthServicer()

    async def start(self) -> None:
        workers = self.app.state.settings.workers
        # several worker processes share the port (each its own picker, like the proxy)
        self.server = grpc.aio.server(options=[("grpc.so_reuseport", 1 if workers > 1 else 0)])
        ext_proc_grpc.add_ExternalProcessorServicer_to_server(Picker(self.app), self.server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        address = f"[{self.host}]:{self.port}" if ":" in self.host else \
            f"{self.host}:{self.port}"
        try:
            bound = self.server.add_insecure_port(address)
        except RuntimeError as exc:
            raise RuntimeError(f"--epp-port: cannot listen on {address} ({exc})") from None
        if not bound:
            raise RuntimeError(f"--epp-port: cannot listen on {address}")
        await self.server.start()
        ready = decision.generation(self.app.state.proxy) is not None
        for name in SERVICES:
            serving = ready or name in ("", "liveness")
            await self.health.set(name, health_pb2.HealthCheckResponse.SERVING if serving
                                  else health_pb2.HealthCheckResponse.NOT_SERVING)
        log.info("endpoint picker (ext_proc) on %s", address)

    async def stop(self) -> None:
        if self.server is None:
            return
        await self.health.enter_graceful_shutdown()
        await self.server.stop(GRACE_S)
        self.server = None
