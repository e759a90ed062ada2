"""``engine-advisor serve`` with its Endpoint Picker's per-stream handler replaced by the floor's
(bench/epp_floor.py: parse each message, answer CONTINUE): the same process, app, event loop,
gRPC server with its options and token check as the picker's, and none of its decisions.
bench_epp.py runs it as ``floor in serve``: what the picker costs over it is the picker's own
Python per request, what it costs over the standalone floor is the process around the server.

Usage:  python bench/epp_floor_serve.py serve --epp-port PORT --upstreams FILE ...
        (the arguments of ``engine-advisor``; the gateway's token from the environment)
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from epp_floor import Floor  # noqa: E402
from grpc.aio import EOF  # noqa: E402

from engine_advisor.cli.main import main  # noqa: E402
from engine_advisor.service.epp import server  # noqa: E402


async def _floor(self, requests, context):  # noqa: ARG001 (the handler's signature)
    floor = Floor()
    read, write = context.read, context.write
    while (raw := await read()) is not EOF:        # bytes, as the picker's handler gets
        await write(floor.answer_bytes(raw))


server.Picker.process = _floor

if __name__ == "__main__":
    sys.exit(main())
