"""The floor of a Python Endpoint Picker: an ext_proc server that decides nothing and answers
every message with CONTINUE, in one of several gRPC stacks. bench_epp.py runs it next to the
real picker; what the picker costs above it is the decision, the rest is the gRPC stack's.

Stacks (``--stack``):

- ``grpcio-aio``: grpcio's asyncio server (the picker's stack), the handler reading and
  writing the stream itself (grpcio's reader-writer API), as the picker's;
- ``grpcio-sync``: grpcio's synchronous server, one thread of a pool per stream;
- ``grpclib``: grpclib (PyPI ``grpclib``, pure Python over ``h2``) on asyncio.

Each serves the gRPC health service too (Envoy's health check of the picker cluster asks
``envoy.service.ext_proc.v3.ExternalProcessor``). Every stack parses each ProcessingRequest
(the answer depends on its kind) and sends pre-serialized answers. In
``FULL_DUPLEX_STREAMED`` body mode a body chunk is echoed (that mode's contract); in the
others a body chunk gets an empty answer (CONTINUE).

Usage:  python bench/epp_floor.py --stack grpcio-aio --port 9002 [--uvloop]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from concurrent.futures import ThreadPoolExecutor

from envoy.extensions.filters.http.ext_proc.v3.processing_mode_pb2 import ProcessingMode
from envoy.service.ext_proc.v3.external_processor_pb2 import (
    BodyMutation,
    BodyResponse,
    CommonResponse,
    HeadersResponse,
    ProcessingRequest,
    ProcessingResponse,
    StreamedBodyResponse,
    TrailersResponse,
)
from grpc_health.v1 import health_pb2

STACKS = ("grpcio-aio", "grpcio-sync", "grpclib")
SERVICE = "envoy.service.ext_proc.v3.ExternalProcessor"
METHOD = f"/{SERVICE}/Process"
DUPLEX = ProcessingMode.FULL_DUPLEX_STREAMED

CONTINUE = {
    "request_headers": ProcessingResponse(request_headers=HeadersResponse()),
    "response_headers": ProcessingResponse(response_headers=HeadersResponse()),
    "request_body": ProcessingResponse(request_body=BodyResponse()),
    "response_body": ProcessingResponse(response_body=BodyResponse()),
    "request_trailers": ProcessingResponse(request_trailers=TrailersResponse()),
    "response_trailers": ProcessingResponse(response_trailers=TrailersResponse()),
}
CONTINUE_BYTES = {k: v.SerializeToString() for k, v in CONTINUE.items()}


class Floor:
    """One stream's state: whether bodies are echoed (FULL_DUPLEX_STREAMED)."""

    __slots__ = ("echo",)

    def __init__(self):
        self.echo = {"request_body": False, "response_body": False}

    def answer(self, req: ProcessingRequest) -> ProcessingResponse:
        if req.HasField("protocol_config"):
            pc = req.protocol_config
            self.echo = {"request_body": pc.request_body_mode == DUPLEX,
                         "response_body": pc.response_body_mode == DUPLEX}
        kind = req.WhichOneof("request")
        if self.echo.get(kind):
            body = getattr(req, kind)
            common = CommonResponse(body_mutation=BodyMutation(streamed_response=(
                StreamedBodyResponse(body=body.body, end_of_stream=body.end_of_stream))))
            return ProcessingResponse(**{kind: BodyResponse(response=common)})
        return CONTINUE[kind]

    def answer_bytes(self, raw: bytes) -> bytes:
        req = ProcessingRequest.FromString(raw)
        kind = req.WhichOneof("request")
        if not req.HasField("protocol_config") and not self.echo.get(kind):
            return CONTINUE_BYTES[kind]
        return self.answer(req).SerializeToString()


def _identity(b: bytes) -> bytes:
    return b


# ------------------------------------------------------------------------------ grpcio
async def _aio_rw(request_iterator, context):  # noqa: ARG001 (read through the context)
    from grpc.aio import EOF

    floor = Floor()
    read, write = context.read, context.write
    while (raw := await read()) is not EOF:
        await write(floor.answer_bytes(raw))


def _sync_gen(request_iterator, context):
    floor = Floor()
    for raw in request_iterator:
        yield floor.answer_bytes(raw)


def _handler(fn, raw: bool = False):
    """``raw``: bytes in and out as they are (no (de)serializer calls: the asyncio server
    allows it); else through ``_identity``."""
    import grpc

    coder = None if raw else _identity
    handler = grpc.stream_stream_rpc_method_handler(
        fn, request_deserializer=coder, response_serializer=coder)
    return grpc.method_handlers_generic_handler(SERVICE, {"Process": handler})


async def serve_aio(port: int) -> None:
    import grpc
    from grpc_health.v1 import health, health_pb2_grpc

    server = grpc.aio.server()
    server.add_generic_rpc_handlers([_handler(_aio_rw, raw=True)])
    checks = health.aio.HealthServicer()
    await checks.set(SERVICE, health_pb2.HealthCheckResponse.SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(checks, server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    await _until_signal()
    await server.stop(1)


def serve_sync(port: int, threads: int) -> None:
    import threading

    import grpc
    from grpc_health.v1 import health, health_pb2_grpc

    server = grpc.server(ThreadPoolExecutor(max_workers=threads),
                         maximum_concurrent_rpcs=None)
    server.add_generic_rpc_handlers([_handler(_sync_gen)])
    checks = health.HealthServicer()
    checks.set(SERVICE, health_pb2.HealthCheckResponse.SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(checks, server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    stop = threading.Event()
    for s in (signal.SIGTERM, signal.SIGINT):
        signal.signal(s, lambda *_: stop.set())
    stop.wait()
    server.stop(1).wait()


# ------------------------------------------------------------------------------ grpclib
class _GrpclibService:
    def __mapping__(self):
        from grpclib.const import Cardinality, Handler

        return {METHOD: Handler(self.process, Cardinality.STREAM_STREAM, ProcessingRequest,
                                ProcessingResponse),
                # grpclib's own health service would register grpc.health.v1 a second time
                "/grpc.health.v1.Health/Check": Handler(
                    self.check, Cardinality.UNARY_UNARY, health_pb2.HealthCheckRequest,
                    health_pb2.HealthCheckResponse)}

    async def check(self, stream) -> None:
        await stream.recv_message()
        await stream.send_message(health_pb2.HealthCheckResponse(
            status=health_pb2.HealthCheckResponse.SERVING))

    async def process(self, stream) -> None:
        floor = Floor()
        async for req in stream:
            await stream.send_message(floor.answer(req))


async def serve_grpclib(port: int) -> None:
    from grpclib.server import Server

    server = Server([_GrpclibService()])
    await server.start("127.0.0.1", port)
    await _until_signal()
    server.close()
    await server.wait_closed()


async def _until_signal() -> None:
    done = asyncio.Event()
    loop = asyncio.get_running_loop()
    for s in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(s, done.set)
    await done.wait()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--stack", choices=STACKS, required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--threads", type=int, default=64, help="grpcio-sync's pool (default 64)")
    ap.add_argument("--uvloop", action="store_true", help="asyncio stacks on uvloop")
    args = ap.parse_args(argv)
    print(f"epp_floor {args.stack} on 127.0.0.1:{args.port} (pid {os.getpid()})", flush=True)
    if args.stack == "grpcio-sync":
        serve_sync(args.port, args.threads)
        return 0
    factory = None
    if args.uvloop:
        import uvloop

        factory = uvloop.new_event_loop
    coro = serve_grpclib(args.port) if args.stack == "grpclib" else serve_aio(args.port)
    with asyncio.Runner(loop_factory=factory) as runner:
        runner.run(coro)
    return 0


if __name__ == "__main__":
    sys.exit(main())
