"""Faults under load, end to end: ``engine-advisor serve --upstreams`` in front of simulator
processes (and, for the hang, an upstream that accepts connections and never answers).

- An upstream SIGKILLed and restarted during load: every request that had not started
  streaming succeeds (non-streaming ones are retried elsewhere), retries are counted in the
  proxy's metrics, the restarted upstream gets traffic again.
- An upstream that accepts and never answers: every request gets its 504 within the
  configured time, and afterwards the proxy holds no more sockets, threads or in-flight
  requests than before (nor does the upstream see connections left open).
- A client that reads a long stream very slowly: the proxy buffers a bounded amount (its
  resident memory stays flat while the stream would be many MB), the engine is held back,
  and closing the connection aborts the upstream request.
- Model reloads (admin) during load: no failed request, both versions answer.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time

import httpx
import pytest
import yaml
from proc import wait_for
from rel_helpers import (
    AUTH,
    Proc,
    load_soak,
    metric_sum,
    open_fds,
    rss_kib,
    serve_proc,
    start_all,
)
from svc_helpers import fit_artifact

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

soak = load_soak()


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("faults")
    (tmp / "models").mkdir()
    versions = [fit_artifact(tmp / "models" / "a.json")["model_version"],
                fit_artifact(tmp / "models" / "b.json", drop_last=1)["model_version"]]
    # ~0.15 ms per token: a 128-token stream lasts ~20 ms, long enough to be cut mid-way
    sims = [Proc("sim", "--engine", "vllm", "--time-scale", "0.05"),
            Proc("sim", "--engine", "vllm", "--time-scale", "0.05"),
            # fast: the slow reader's long stream comes from here (a long prompt goes to SGLang)
            Proc("sim", "--engine", "sglang", "--dcp-size", "8", "--time-scale", "0.001")]
    srv = serve_proc(tmp, sims[:2], sims[2:],
                     env={"ENGINE_ADVISOR_MODELS_DIR": str(tmp / "models")},
                     timeouts={"first_byte_s": 10.0, "idle_s": 10.0, "total_s": 60.0},
                     breaker={"failure_threshold": 1000})
    procs = start_all(*sims, srv)
    try:
        yield {"proxy": srv, "vllm-0": sims[0], "vllm-1": sims[1], "sglang": sims[2],
               "versions": versions}
    finally:
        for p in procs:
            p.stop()


class Outcomes:
    """Classifies proxied responses: ok, failed after streaming had started (allowed when
    the upstream died mid-stream), lost (anything else)."""

    def __init__(self):
        self.ok = self.midstream = 0
        self.lost: list[str] = []

    def __call__(self, status: int, body: bytes, streaming: bool) -> bool:
        if soak.ok_proxy(status, body, streaming):
            self.ok += 1
        elif status == 200 and streaming and body.startswith(b"data: {") \
                and b'data: {"error"' in body and body.index(b'data: {"error"') > 0:
            self.midstream += 1
        else:
            self.lost.append(f"HTTP {status} stream={streaming}: {body[-200:]!r}")
        return True


def test_upstream_restarted_during_load_loses_no_request_before_streaming(stack):
    proxy, victim = stack["proxy"], stack["vllm-0"]
    host, port = proxy.url.removeprefix("http://").split(":")
    # longer answers (128 tokens) than the soak's, so that some streams are cut mid-way
    requests = soak.proxy_requests(host, int(port), max_tokens=128)
    retries0 = metric_sum(proxy.url, "engine_advisor_proxy_retries_total")
    served0 = metric_sum(proxy.url, "engine_advisor_proxy_requests_total", upstream="vllm-0")
    outcomes = Outcomes()
    n = 3000

    async def scenario():
        load = asyncio.create_task(soak.drive(proxy.url, requests, n, 32, outcomes,
                                              proxy.proc.pid))
        await asyncio.sleep(0.6)
        running = await asyncio.to_thread(victim.metric, "vllm:num_requests_running")
        victim.kill()
        await asyncio.sleep(0.3)
        await asyncio.to_thread(lambda: victim.start().wait_ready(30))
        result = await load
        return running, result

    running, result = asyncio.run(scenario())
    retries = metric_sum(proxy.url, "engine_advisor_proxy_retries_total") - retries0
    print(f"\nrestart under load: {n} requests, {outcomes.ok} ok, {outcomes.midstream} cut "
          f"mid-stream, {len(outcomes.lost)} lost; {running:.0f} running on the victim when "
          f"killed; {retries:.0f} retries counted")
    assert not outcomes.lost, outcomes.lost[:5]
    assert outcomes.ok + outcomes.midstream == result["completed"] == n
    assert retries >= 1
    # the restarted upstream is healthy again and gets requests
    assert wait_for(lambda: metric_sum(proxy.url, "engine_advisor_proxy_upstream_healthy",
                                       upstream="vllm-0") == 1, 10)
    before = metric_sum(proxy.url, "engine_advisor_proxy_requests_total", upstream="vllm-0")
    assert before > served0
    with httpx.Client(base_url=proxy.url, timeout=30) as h:
        for _ in range(8):
            assert h.post("/v1/completions", json={"model": "kimi-k3", "prompt": "x",
                                                   "max_tokens": 2}).status_code == 200
    assert metric_sum(proxy.url, "engine_advisor_proxy_requests_total",
                      upstream="vllm-0") > before


# ----------------------------------------------------------------------------- hangs
class BlackHole:
    """A TCP server that answers GET /health and reads every other request forever."""

    def __init__(self):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.open = 0
        self.accepted = 0
        self.lock = threading.Lock()
        self.running = True
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while self.running:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with self.lock:
                self.open += 1
                self.accepted += 1
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        try:
            while True:
                data = conn.recv(65536)
                if not data:
                    return
                if data.startswith(b"GET /health"):
                    conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                # anything else: never answered
        except OSError:
            return
        finally:
            conn.close()
            with self.lock:
                self.open -= 1

    def close(self) -> None:
        self.running = False
        self.sock.close()


def test_upstream_that_never_answers_times_out_without_leaking(tmp_path):
    hole = BlackHole()
    srv = None
    try:
        # the hole is the only upstream: no other engine to fall back to, no breaker opening
        srv = serve_proc(tmp_path, [], [], timeouts={"first_byte_s": 1.0, "idle_s": 1.0,
                                                      "total_s": 2.0},
                         retries={"max_attempts": 1}, breaker={"failure_threshold": 1000})
        path = tmp_path / "upstreams.yaml"
        doc = yaml.safe_load(path.read_text())
        doc["pools"] = {"vllm": [{"url": hole.url, "model": "kimi-k3", "dcp_size": 1}]}
        path.write_text(yaml.safe_dump(doc))
        start_all(srv)
        pid = srv.proc.pid
        chat = {"model": "kimi-k3", "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 8}
        with httpx.Client(base_url=srv.url, timeout=30) as h:     # warm everything once
            assert h.post("/v1/chat/completions", json=chat).status_code == 504
        assert wait_for(lambda: hole.open <= 1, 5)
        fds0 = open_fds(pid)

        async def many(n: int) -> list[tuple[int, float, str]]:
            async with httpx.AsyncClient(base_url=srv.url, timeout=30,
                                         limits=httpx.Limits(max_connections=n)) as c:
                async def one(i: int):
                    t0 = time.monotonic()
                    r = await c.post("/v1/chat/completions", json={**chat, "stream": i % 2 == 0})
                    try:
                        message = r.json()["error"]["message"]
                    except (ValueError, KeyError):
                        message = f"not JSON: {r.headers} {r.content[:300]!r}"
                    return r.status_code, time.monotonic() - t0, message
                return await asyncio.gather(*(one(i) for i in range(n)))

        for _ in range(2):
            results = asyncio.run(many(40))
            assert {s for s, _, _ in results} == {504}, results[:3]
            assert all("timed out" in m for _, _, m in results), results
            streamed = [t for i, (_, t, _) in enumerate(results) if i % 2 == 0]
            whole = [t for i, (_, t, _) in enumerate(results) if i % 2 == 1]
            assert max(streamed) < 1.0 + 2.0 and min(streamed) >= 1.0        # first_byte_s
            assert max(whole) < 2.0 + 2.0 and min(whole) >= 2.0              # total_s
            # the proxy let go of every upstream connection and client socket
            assert wait_for(lambda: hole.open <= 1, 5), hole.open
            assert wait_for(lambda: open_fds(pid) <= fds0 + 2, 5), (open_fds(pid), fds0)
            assert metric_sum(srv.url, "engine_advisor_proxy_upstream_in_flight") == 0
        print(f"\nhang: 80 requests to an upstream that never answers: all 504 (streaming "
              f"after ~1 s, whole after ~2 s); proxy fds {fds0} before, {open_fds(pid)} "
              f"after; upstream connections accepted {hole.accepted}, open {hole.open}")
    finally:
        if srv is not None:
            srv.stop()
        hole.close()


# ----------------------------------------------------------------------------- slow client
def test_slow_reading_client_is_bounded_and_its_departure_aborts(stack):
    proxy, pid, sim = stack["proxy"], stack["proxy"].proc.pid, stack["sglang"]
    # 130,000 prompt token ids (routed to SGLang) and 130,000 tokens out: ~20 MB of events
    body = json.dumps({"model": "kimi-k3", "prompt": [7] * 130_000, "max_tokens": 130_000,
                       "ignore_eos": True, "stream": True}).encode()
    host, port = proxy.url.removeprefix("http://").split(":")
    rss0, fds0 = rss_kib(pid), open_fds(pid)
    made0 = metric_sum(sim.url, "sglang:generation_tokens_total")
    aborted0 = metric_sum(sim.url, "sglang:num_requests_total")
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect((host, int(port)))
    got = 0
    try:
        s.sendall((f"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: "
                   f"application/json\r\ncontent-length: {len(body)}\r\n\r\n").encode() + body)
        head = s.recv(1024)
        assert head.startswith(b"HTTP/1.1 200") and b"upstream: sglang-0" in head, head
        streaming0 = peak = rss_kib(pid)          # the prompt is parsed by now
        t0 = time.monotonic()
        while time.monotonic() - t0 < 4.0:               # ~100 KB/s for 4 s
            got += len(s.recv(1024))
            time.sleep(0.01)
            peak = max(peak, rss_kib(pid))
        made = metric_sum(sim.url, "sglang:generation_tokens_total") - made0
        assert metric_sum(proxy.url, "engine_advisor_proxy_upstream_in_flight") == 1
    finally:
        s.close()
    growth_mib = (peak - streaming0) / 1024
    print(f"\nslow reader: read {got / 1024:.0f} KiB in 4 s; proxy RSS +{growth_mib:.1f} MiB "
          f"while streaming (+{(streaming0 - rss0) / 1024:.1f} MiB for the 0.4 MB prompt); "
          f"simulator generated {made:.0f} tokens (~{made * 150 / 2**20:.0f} MiB of events)")
    assert got < 1 << 20
    # the simulator (like the engines) generates regardless of the client and buffers its
    # output; the proxy reads from it only as fast as the client takes: its memory stays flat
    assert made * 150 > 10 * got, (made, got)
    assert growth_mib < 4, growth_mib
    # once the client is gone, the proxy lets go of the request and its sockets, and the
    # engine's request ends (aborted: it had far from 130,000 tokens delivered)
    assert wait_for(lambda: metric_sum(proxy.url, "engine_advisor_proxy_upstream_in_flight")
                    == 0, 5)
    assert wait_for(lambda: open_fds(pid) <= fds0 + 1, 5), (open_fds(pid), fds0)
    assert wait_for(lambda: sim.metric("sglang:num_running_reqs") == 0, 10)
    assert metric_sum(sim.url, "sglang:num_requests_total") == aborted0 + 1


# ----------------------------------------------------------------------------- reloads
def test_model_reloads_during_load_fail_no_request(stack):
    proxy, versions = stack["proxy"], stack["versions"]
    host, port = proxy.url.removeprefix("http://").split(":")
    mixed = soak.recommend_requests(host, int(port), 400) + soak.proxy_requests(host, int(port))
    seen: set[bytes] = set()
    bad: list[str] = []

    def check(status: int, body: bytes, streaming: bool) -> bool:
        if b'"model_version"' in body:                  # a recommendation
            if not soak.ok_recommend(status, body, streaming):
                bad.append(body[-200:].decode(errors="replace"))
            seen.add(body.rsplit(b'"model_version":"', 1)[1].split(b'"', 1)[0])
        elif not soak.ok_proxy(status, body, streaming):
            bad.append(f"{status} {body[-200:]!r}")
        return True

    reloads: list[int] = []

    async def scenario():
        load = asyncio.create_task(soak.drive(proxy.url, mixed, 3000, 32, check,
                                              proxy.proc.pid))
        async with httpx.AsyncClient(base_url=proxy.url, headers=AUTH, timeout=30) as c:
            i = 0
            while not load.done():
                r = await c.post("/v1/model/reload", json={"path": "ab"[i % 2] + ".json"})
                reloads.append(r.status_code)
                i += 1
                await asyncio.sleep(0.05)
        return await load

    result = asyncio.run(scenario())
    print(f"\nreloads under load: {len(reloads)} reloads, {result['completed']} requests, "
          f"{len(bad)} failed, versions answered {sorted(v.decode() for v in seen)}")
    assert not bad, bad[:3]
    assert result["completed"] == 3000 and result["errors"] == 0
    assert len(reloads) >= 4 and set(reloads) == {200}
    assert {v.encode() for v in versions} <= seen
