"""Hostile clients against ``engine-advisor serve --upstreams`` in front of two simulators (a
vLLM pool and an SGLang pool): the figures of docs/reliability.md's "hostile clients" table.

Each case is run over raw sockets on loopback and reported as what the client saw, with times
and the service's CPU and memory read from /proc. Timeouts are shortened to ``--timeout`` s
(the defaults are 60 s) so a run takes about two minutes. The same script runs against
another checkout's code (``PYTHONPATH=/path/to/checkout``) for a before/after comparison;
options that checkout lacks are then simply not in effect.

Usage:  .venv/bin/python bench/hostile_clients.py [--timeout 5] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_proxy import EXE, free_port, stop  # noqa: E402
from soak import rss_kib, start  # noqa: E402

MODEL = "kimi-k3"
ADMIN = "hostile-admin-token"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


# ----------------------------------------------------------------------------- the stack
class Stack:
    def __init__(self, tmp: Path, timeout: float, nofile: int | None = None,
                 data_dir: Path | None = None):
        self.tmp, self.procs = tmp, []
        self.sims = []
        for engine in ("vllm", "sglang"):
            port = free_port()
            extra = ["--dcp-size", "8"] if engine == "sglang" else []
            self.procs.append(start([str(EXE), "sim", "--engine", engine, "--port", str(port),
                                     "--time-scale", "0.001", *extra], tmp / f"{engine}.log"))
            self.sims.append(f"http://127.0.0.1:{port}")
        doc = {"pools": {"vllm": [{"url": self.sims[0], "model": MODEL, "mem_fraction": 0.92}],
                         "sglang": [{"url": self.sims[1], "model": MODEL, "dcp_size": 8,
                                     "mem_fraction": 0.92}]},
               "workload": {"preset": MODEL, "gpu": "B300", "num_gpus": 8, "batch_size": 64},
               "timeouts": {"answer_s": timeout}}
        if not _knows_answer_s():              # another checkout: its pools file has no such key
            del doc["timeouts"]
        (tmp / "upstreams.yaml").write_text(json.dumps(doc))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [str(EXE), "serve", "--port", str(self.port), "--upstreams",
               str(tmp / "upstreams.yaml"), "--log-level", "warning"]
        if data_dir is not None:
            cmd += ["--data-dir", str(data_dir)]
        if nofile is not None:
            cmd = ["sh", "-c", f'ulimit -n {nofile} && exec "$0" "$@"', *cmd]
        self.log = tmp / "serve.log"
        self.serve = start(cmd, self.log, env={
            "ENGINE_ADVISOR_ADMIN_TOKEN": ADMIN, "ENGINE_ADVISOR_UPSTREAMS_WATCH_S": "0",
            "ENGINE_ADVISOR_HEADER_TIMEOUT_S": str(timeout),
            "ENGINE_ADVISOR_BODY_TIMEOUT_S": str(timeout)})
        self.procs.append(self.serve)
        for url in (*(s + "/health" for s in self.sims), self.url + "/readyz"):
            deadline = time.monotonic() + 90
            while True:
                try:
                    if httpx.get(url, timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline or self.serve.poll() is not None:
                    self.close()
                    raise RuntimeError(f"{url} not ready: {self.log.read_text()[-2000:]}")
                time.sleep(0.1)

    def cpu_s(self) -> float:
        with open(f"/proc/{self.serve.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def close(self) -> None:
        stop(self.procs)


def _knows_answer_s() -> bool:
    r = subprocess.run([sys.executable, "-c",
                        "from engine_advisor.service.proxy.upstreams import TimeoutsSpec;"
                        "print('answer_s' in TimeoutsSpec.model_fields)"],
                       capture_output=True, text=True, timeout=60)
    return r.stdout.strip() == "True"


# ----------------------------------------------------------------------------- sockets
def connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=30)


def read_all(s: socket.socket, limit: float) -> tuple[bytes, str]:
    """(bytes until the server closed, or ``limit`` passed; how it ended)."""
    out, deadline = b"", time.monotonic() + limit
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return out, "still open"
        s.settimeout(left)
        try:
            data = s.recv(65536)
        except TimeoutError:
            return out, "still open"
        except OSError as exc:
            return out, type(exc).__name__
        if not data:
            return out, "closed"
        out += data


def exchange(port: int, pieces, limit: float = 60.0) -> tuple[bytes, str, float]:
    """Send ``pieces`` while reading; (answer, how the connection ended, seconds)."""
    s = connect(port)
    got: list = []
    t = time.monotonic()
    reader = threading.Thread(target=lambda: got.append(read_all(s, limit)))
    reader.start()
    for p in pieces:
        try:
            s.sendall(p)
        except OSError:
            break
    reader.join(limit + 30)
    s.close()
    return got[0][0], got[0][1], time.monotonic() - t


def status(raw: bytes) -> str:
    return raw.split(b"\r\n", 1)[0].decode("latin-1")[9:] if raw else "nothing"


def head(path: str, extra: bytes = b"") -> bytes:
    return (b"POST " + path.encode() + b" HTTP/1.1\r\nhost: x\r\ncontent-type: "
            b"application/json\r\n" + extra)


# ----------------------------------------------------------------------------- cases
def big_heads(st: Stack) -> list[dict]:
    out = []
    body = json.dumps(CHAT).encode()
    for name, extra in (("one 1 MiB request header", b"x-big: " + b"a" * (1 << 20) + b"\r\n"),
                        ("10,000 request headers",
                         b"".join(b"x-h%d: 1\r\n" % i for i in range(10_000)))):
        raw, end, took = exchange(st.port, [head("/v1/chat/completions", extra)
                                            + b"content-length: %d\r\n\r\n" % len(body) + body])
        out.append({"case": name, "answer": status(raw), "connection": end,
                    "seconds": round(took, 3)})
    return out


def huge_head(st: Stack) -> dict:
    lat: list[float] = []
    errors: list[str] = []
    stop_ = threading.Event()

    def others() -> None:
        with httpx.Client(base_url=st.url, timeout=120) as c:
            while not stop_.is_set():
                t = time.perf_counter()
                try:
                    c.get("/healthz")
                except httpx.HTTPError as exc:
                    errors.append(type(exc).__name__)
                lat.append(time.perf_counter() - t)
                time.sleep(0.01)

    th = threading.Thread(target=others)
    th.start()
    time.sleep(0.5)
    cpu = st.cpu_s()
    raw, end, took = exchange(st.port, [head("/v1/chat/completions") + b"x-big: ",
                                        *[b"a" * (1 << 20)] * 96], limit=120)
    used = st.cpu_s() - cpu
    time.sleep(0.5)
    stop_.set()
    th.join(150)
    return {"case": "one 96 MiB request header", "answer": status(raw), "connection": end,
            "seconds": round(took, 2), "service_cpu_s": round(used, 2),
            "other_clients_max_latency_s": round(max(lat), 3),
            "other_clients_errors": len(errors)}


def silent(st: Stack, timeout: float) -> list[dict]:
    out = []
    raw, end, took = exchange(st.port, [], limit=3 * timeout)
    out.append({"case": "a connection that sends nothing", "answer": status(raw),
                "connection": end, "seconds": round(took, 1)})
    s = connect(st.port)
    data = head("/v1/recommend")
    t = time.monotonic()
    got: list = []
    reader = threading.Thread(target=lambda: got.append(read_all(s, 3 * timeout)))
    reader.start()
    for i in range(len(data)):
        if not reader.is_alive():
            break
        try:
            s.send(data[i:i + 1])
        except OSError:
            break
        time.sleep(1.0)
    reader.join(60)
    s.close()
    out.append({"case": "a head sent a byte a second", "answer": status(got[0][0]),
                "connection": got[0][1], "seconds": round(time.monotonic() - t, 1)})
    return out


def slow_bodies(st: Stack, timeout: float) -> dict:
    """16 clients, each declaring 32 MiB and sending it at 4 MiB/s (8 s in all)."""
    rss0 = rss_kib(st.serve.pid)
    peak = [rss0]
    results: list = []
    chunk = b" " * (256 << 10)

    def one() -> None:
        s = connect(st.port)
        got: list = []
        reader = threading.Thread(target=lambda: got.append(read_all(s, 4 * timeout + 20)))
        reader.start()
        t = time.monotonic()
        try:
            s.sendall(head("/v1/completions", b"content-length: %d\r\n\r\n" % (32 << 20))
                      + b'{"model": "kimi-k3", "prompt": "')
            for _ in range(32 * 4):
                if not reader.is_alive():
                    break
                s.sendall(chunk)
                time.sleep(0.0625)
        except OSError:
            pass
        reader.join(4 * timeout + 30)
        s.close()
        results.append((status(got[0][0]), round(time.monotonic() - t, 1)))

    threads = [threading.Thread(target=one) for _ in range(16)]
    for th in threads:
        th.start()
    while any(th.is_alive() for th in threads):
        peak.append(rss_kib(st.serve.pid))
        time.sleep(0.1)
    answers = sorted({r[0] for r in results})
    return {"case": "16 bodies of 32 MiB arriving at 4 MiB/s each",
            "answer": ", ".join(answers), "seconds_max": max(r[1] for r in results),
            "rss_peak_growth_mib": round((max(peak) - rss0) / 1024, 1),
            "rss_after_mib": round((rss_kib(st.serve.pid) - rss0) / 1024, 1)}


def malformed(st: Stack) -> list[dict]:
    cases = {"JSON nested 100,000 deep": b'{"x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
             "an integer of 5,000 digits": b'{"model": "kimi-k3", "max_tokens": '
                                           + b"9" * 5000 + b"}",
             "a lone surrogate (\\ud800)": b'{"model": "kimi-k3", "prompt": "\\ud800", '
                                          b'"messages": [{"role": "user", "content": '
                                          b'"\\ud800"}], "text": "\\ud800", '
                                          b'"context_tokens": 1000}'}
    paths = ["/v1/recommend", "/v1/route", "/v1/chat/completions", "/v1/completions",
             "/generate"]
    out = []
    before = st.log.read_text(errors="replace").count("Traceback")
    for name, raw in cases.items():
        got = []
        for p in paths:
            r = httpx.post(st.url + p, content=raw, timeout=60,
                           headers={"content-type": "application/json"})
            got.append(str(r.status_code))
        sim = [str(httpx.post(u + "/v1/completions", content=raw, timeout=60,
                              headers={"content-type": "application/json"}).status_code)
               for u in st.sims]
        out.append({"case": name, "answer": "/".join(got) + " (simulators " + "/".join(sim)
                    + ")"})
    after = st.log.read_text(errors="replace").count("Traceback")
    out.append({"case": "tracebacks logged by serve for them", "answer": str(after - before)})
    return out


def request_of_death(st: Stack) -> dict:
    with httpx.Client(base_url=st.url, timeout=60) as c:
        bad = [c.post("/v1/chat/completions", json=CHAT,
                      headers={"x-return-error": "500"}).status_code for _ in range(12)]
        good = [c.post("/v1/chat/completions", json=CHAT).status_code for _ in range(20)]
    return {"case": "12 requests every upstream fails (500), then 20 normal ones",
            "answer": f"bad: {bad.count(500)}x 500; normal: "
                      + ", ".join(f"{good.count(s)}x {s}" for s in sorted(set(good)))}


def transfer_coding(st: Stack) -> dict:
    body = json.dumps(CHAT).encode()
    raw, end, _ = exchange(st.port, [head("/v1/chat/completions",
                                          b"transfer-encoding: gzip, chunked\r\n\r\n")
                                     + b"%x\r\n" % len(body) + body + b"\r\n0\r\n\r\n"])
    return {"case": "Transfer-Encoding: gzip, chunked", "answer": status(raw)}


def hang(st: Stack, timeout: float) -> dict:
    t = time.monotonic()
    try:
        r = httpx.post(st.url + "/v1/chat/completions", json=CHAT, headers={"x-hang": "1"},
                       timeout=3 * timeout)
        answer = str(r.status_code)
    except httpx.TimeoutException:
        answer = f"nothing within {3 * timeout:g} s"
    return {"case": f"a non-streamed request whose upstream never answers (answer_s "
                    f"{timeout:g})", "answer": answer,
            "seconds": round(time.monotonic() - t, 1)}


def fd_exhaustion(tmp: Path, timeout: float) -> dict:
    st = Stack(tmp, timeout, nofile=256)
    held = []
    try:
        for _ in range(2000):
            try:
                held.append(connect(st.port))
            except OSError:
                break
        time.sleep(1.0)
        raw, end, _ = exchange(st.port, [b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n"],
                               limit=10)
        during = status(raw) or end
        for s in held:
            s.close()
        t = time.monotonic()
        after = "no answer"
        while time.monotonic() - t < 4 * timeout + 10:
            try:
                after = str(httpx.get(st.url + "/healthz", timeout=2).status_code)
                if after == "200":
                    break
            except httpx.HTTPError as exc:
                after = type(exc).__name__
            time.sleep(0.2)
        return {"case": f"{len(held)} idle sockets against a 256-file process",
                "answer": f"a new client: {during}; after they close: {after}",
                "alive": st.serve.poll() is None}
    finally:
        st.close()


def crash(tmp: Path, timeout: float) -> dict:
    data = tmp / "data"
    try:
        st = Stack(tmp, timeout, data_dir=data)
    except RuntimeError:             # a checkout without --data-dir
        data = None
        st = Stack(tmp, timeout)
    try:
        with httpx.Client(base_url=st.url, timeout=30) as c:
            for _ in range(500):
                c.post("/v1/chat/completions", json=CHAT)
        before = httpx.get(st.url + "/v1/observations", timeout=30,
                           headers={"authorization": f"Bearer {ADMIN}"}).text.count("\n") - 1
        time.sleep(1.5)
        os.killpg(st.serve.pid, 9)
        st.serve.wait()
    finally:
        st.close()
    st = Stack(tmp, timeout, data_dir=data)
    try:
        after = httpx.get(st.url + "/v1/observations", timeout=30,
                          headers={"authorization": f"Bearer {ADMIN}"}).text.count("\n") - 1
    finally:
        st.close()
    return {"case": f"SIGKILL of serve holding {before} observations",
            "answer": f"{after} back after the restart"}


class Payload:
    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (os.mkdir, (self.marker,))


def artifact(tmp: Path) -> dict:
    marker = tmp / "pwned"
    path = tmp / "m.joblib"
    path.write_bytes(pickle.dumps(Payload(str(marker)), protocol=4))
    import hashlib
    (tmp / "m.joblib.json").write_text(json.dumps({
        "schema_version": 2, "artifact_sha256": hashlib.sha256(path.read_bytes()).hexdigest()}))
    r = subprocess.run([str(EXE), "recommend", "--context-tokens", "1000", "--output-tokens",
                        "8", "--kv-bytes-per-token", "70272", "--model", str(path)],
                       capture_output=True, text=True, timeout=120)
    return {"case": "recommend --model of an artifact whose unpickling runs code",
            "answer": f"exit {r.returncode}; the code ran: {marker.exists()}",
            "message": r.stderr.strip().splitlines()[-1][:200] if r.stderr else ""}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--timeout", type=float, default=5.0,
                    help="header, body and answer timeouts in seconds (default 5)")
    ap.add_argument("--json", type=Path, help="also write the rows as JSON here")
    args = ap.parse_args()
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="hostile-") as d:
        tmp = Path(d)
        (tmp / "a").mkdir()
        st = Stack(tmp / "a", args.timeout)
        try:
            rows += big_heads(st)
            rows.append(huge_head(st))
            rows += silent(st, args.timeout)
            rows.append(slow_bodies(st, args.timeout))
            rows += malformed(st)
            rows.append(transfer_coding(st))
            rows.append(hang(st, args.timeout))
            rows.append(request_of_death(st))        # last: it may open breakers
        finally:
            st.close()
        for name, fn in (("b", lambda p: fd_exhaustion(p, args.timeout)),
                         ("c", lambda p: crash(p, args.timeout)), ("d", artifact)):
            (tmp / name).mkdir()
            rows.append(fn(tmp / name))
    for r in rows:
        print(" | ".join(f"{k}: {v}" for k, v in r.items()))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
