"""The test helper's processes answer for themselves: a port taken by another process between
``free_port`` and the child's bind is noticed, and the child moves to a fresh port."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
from proc import Proc, owns_port, start_all


class _AlwaysReady(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 (http.server's name)
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args):
        pass


def test_a_process_whose_port_was_taken_moves_and_is_the_one_answering():
    squatter = ThreadingHTTPServer(("127.0.0.1", 0), _AlwaysReady)
    threading.Thread(target=squatter.serve_forever, daemon=True).start()
    taken = squatter.server_address[1]
    sim = Proc("sim", "--engine", "vllm", "--time-scale", "0.01")
    sim.port = taken                           # as if another process bound it first
    sim.args[sim.args.index("--port") + 1] = str(taken)
    try:
        start_all(sim)
        assert sim.port != taken
        assert owns_port(sim.proc.pid, sim.port) is True
        assert "address already in use" in sim.log.lower()
        models = httpx.get(sim.url + "/v1/models", timeout=10).json()
        assert models["data"], models            # the simulator, not the squatter's {}
    finally:
        sim.stop()
        squatter.shutdown()
        squatter.server_close()
