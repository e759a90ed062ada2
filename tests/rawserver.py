"""Shared test helper: a raw asyncio TCP server on its own event loop in a thread, on a free
loopback port, for upstreams that misbehave in ways no HTTP framework lets them.

Subclasses write ``async def serve(reader, writer)``; ``stop()`` closes the server and
cancels the connections still open. ``read_request`` reads one request off such a connection.
"""

from __future__ import annotations

import asyncio
import socket
import threading


class ThreadedServer:
    def __init__(self):
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        assert self.ready.wait(10), "the test server did not start"

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        raise NotImplementedError

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.server = self.loop.run_until_complete(
            asyncio.start_server(self.serve, "127.0.0.1", self.port))
        self.ready.set()
        self.loop.run_forever()

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self._shutdown(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()

    async def _shutdown(self) -> None:
        self.server.close()
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.server.wait_closed()


async def read_request(reader: asyncio.StreamReader) -> tuple[str, dict[str, str], bytes]:
    """One HTTP/1.1 request with a Content-Length (or none): its request line, its header
    fields (lower-case names) and its body."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    fields = {k.lower(): v for k, v in (ln.split(": ", 1) for ln in lines[1:] if ": " in ln)}
    body = await reader.readexactly(int(fields.get("content-length", 0)))
    return lines[0], fields, body
