"""The gRPC server: ``envoy.service.ext_proc.v3.ExternalProcessor`` and ``grpc.health.v1``,
on the app's event loop (the decision reads the proxy's live state), on grpcio's asyncio
server (bench/bench_epp.py measures it against grpcio's threaded server and grpclib: the
fastest of them here, docs/gateway.md has the figures).

Health services, as the Endpoint Picker Protocol names them: ``liveness`` (the process
answers), ``readiness`` and ``envoy.service.ext_proc.v3.ExternalProcessor`` (pools are loaded
and the picker takes requests), and ``""`` (the server as a whole). All turn NOT_SERVING when
the service shuts down.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import grpc
from grpc.aio import EOF
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from engine_advisor.service.epp import auth, decision, wire
from engine_advisor.service.epp.endpoints import Endpoints
from engine_advisor.service.epp.exchange import Answers, Exchange

log = logging.getLogger("engine_advisor.epp")

EXT_PROC = "envoy.service.ext_proc.v3.ExternalProcessor"
PROCESS = f"/{EXT_PROC}/Process"
SERVICES = ("", "liveness", "readiness", EXT_PROC)
GRACE_S = 5.0
SWEEP_S = 1.0
MESSAGE_SLACK = 1 << 20        # a buffered body's message: the body cap plus this


class Picker:
    """``Process``: one stream per HTTP request through the gateway; ``sweep()`` ends the
    in-flight count of a stream silent for ``idle_s`` (checked every ``idle_s / 4``).

    The handler reads and writes the stream itself (grpcio's reader-writer API), not as an
    async generator over a request iterator: that costs two Python-level generators per
    message less. Messages come and go as bytes: no deserializer (the exchange reads the
    wire format) and no serializer (every answer is already serialized)."""

    def __init__(self, app, token: auth.TokenCheck, idle_s: float, counts):
        self.token, self.idle_s, self.counts = token, idle_s, counts
        self.proxy, self.holder = app.state.proxy, app.state.holder
        self.endpoints = Endpoints()
        self.answers = Answers()
        self.live: set[Exchange] = set()

    async def process(self, requests, context):   # noqa: ARG002 (read through the context)
        ex = Exchange(self.proxy, self.holder.current, self.endpoints, self.answers,
                      self.counts)
        clock = asyncio.get_running_loop().time
        read, write = context.read, context.write
        self.live.add(ex)
        try:
            while (raw := await read()) is not EOF:
                ex.last = clock()
                try:
                    answers = ex.on(raw)
                except wire.WireError as exc:
                    await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                        f"not an ext_proc ProcessingRequest: {exc}")
                if answers is None:
                    answers = await ex.decide()
                for out in answers:
                    await write(out)
                if ex.closed:
                    return
        finally:
            self.live.discard(ex)
            ex.finish()

    async def refuse(self, requests, context):    # noqa: ARG002
        await context.abort(grpc.StatusCode.UNAUTHENTICATED,
                            "the endpoint picker takes streams from its gateway only")

    async def sweep(self) -> None:
        """Every ``SWEEP_S``: the other workers' counts; every ``idle_s / 4``: idle streams."""
        loop = asyncio.get_running_loop()
        next_idle = loop.time() + self.idle_s / 4
        while True:
            await asyncio.sleep(min(SWEEP_S, self.idle_s / 4))
            try:
                decision.sync(self.proxy, self.counts)
            except Exception:             # a broken table must not end the idle sweep
                log.exception("endpoint picker: reading the other workers' counts failed")
            now = loop.time()
            if now < next_idle:
                continue
            next_idle = now + self.idle_s / 4
            stale = now - self.idle_s
            for ex in [e for e in self.live if e.last < stale and e.holding is not None]:
                log.warning("endpoint picker: a stream silent for %g s gave up the in-flight "
                            "count of its request to %s", self.idle_s, ex.holding.name)
                ex.finish()

    def handler(self) -> grpc.GenericRpcHandler:
        return _Handler(self)


class _Handler(grpc.GenericRpcHandler):
    """``Process`` for streams that carry the gateway's token, a refusal for the others: the
    token is read from the metadata grpcio has already decoded to look the method up."""

    def __init__(self, picker: Picker):
        self.token = picker.token

        def method(fn):       # bytes in and out (engine_advisor.service.epp.wire reads them)
            return grpc.stream_stream_rpc_method_handler(fn)

        self.process, self.refuse = method(picker.process), method(picker.refuse)

    def service(self, details):
        if details.method != PROCESS:
            return None
        return self.process if self.token.allows(details.invocation_metadata) else self.refuse


MAX_STREAMS_PER_CONNECTION = 1024   # the gateway opens a connection per 16 (deploy/gateway)


class PickerServer:
    def __init__(self, app, host: str, port: int, counts):
        self.app, self.host, self.port, self.counts = app, host, port, counts
        self.server: grpc.aio.Server | None = None
        self.health = health.aio.HealthServicer()
        self.sweeper: asyncio.Task | None = None

    async def start(self) -> None:
        settings = self.app.state.settings
        why = auth.problem(settings)
        if why is not None:
            raise RuntimeError(why)
        max_message = max(decision.body_cap(self.app.state.proxy), 32 << 20) + MESSAGE_SLACK
        options = [("grpc.max_receive_message_length", max_message),
                   # several worker processes share the port (each its own picker, like the
                   # proxy); the gateway's connections are spread over them by the kernel
                   ("grpc.so_reuseport", 1 if settings.workers > 1 else 0),
                   # the front door's limits (engine_advisor.service.frontdoor), as gRPC states
                   # them: a stream's metadata is bounded like a request head, a connection carrying
                   # no stream is closed after the head timeout, streams per connection capped
                   ("grpc.max_metadata_size", settings.max_header_bytes),
                   ("grpc.absolute_max_metadata_size", settings.max_header_bytes),
                   ("grpc.max_connection_idle_ms", int(settings.header_timeout_s * 1000)),
                   ("grpc.max_concurrent_streams", MAX_STREAMS_PER_CONNECTION)]
        self.server = grpc.aio.server(options=options)
        token = settings.epp_token.get_secret_value() if settings.epp_token else None
        picker = Picker(self.app, auth.TokenCheck(token), settings.epp_idle_timeout_s,
                        self.counts)
        self.server.add_generic_rpc_handlers([picker.handler()])
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        address = f"[{self.host}]:{self.port}" if ":" in self.host else \
            f"{self.host}:{self.port}"
        creds = auth.credentials(settings)
        try:
            bound = (self.server.add_secure_port(address, creds) if creds is not None
                     else self.server.add_insecure_port(address))
        except RuntimeError as exc:
            raise RuntimeError(f"--epp-port: cannot listen on {address} ({exc})") from None
        if not bound:
            raise RuntimeError(f"--epp-port: cannot listen on {address}")
        await self.server.start()
        self.sweeper = asyncio.create_task(picker.sweep(), name="epp-idle-sweep")
        ready = decision.generation(self.app.state.proxy) is not None
        for name in SERVICES:
            serving = ready or name in ("", "liveness")
            await self.health.set(name, health_pb2.HealthCheckResponse.SERVING if serving
                                  else health_pb2.HealthCheckResponse.NOT_SERVING)
        log.info("endpoint picker (ext_proc%s) on %s", ", mutual TLS" if
                 settings.epp_tls_client_ca else "", address)

    async def stop(self) -> None:
        if self.server is None:
            return
        await self.health.enter_graceful_shutdown()
        await self.server.stop(GRACE_S)
        self.server = None
        if self.sweeper is not None:
            self.sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.sweeper
            self.sweeper = None
