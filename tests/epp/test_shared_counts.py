"""In-flight counts shared by picker workers (engine_advisor.service.epp.shared): another process
publishes its picks, this one adds them to its upstreams' counts; a worker that dies takes its
counts with it; a worker on another pools file is not added. Then the same with ``serve --workers
2`` for real: every worker's /metrics shows the in-flight requests of both."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import grpc
import httpx
import pytest
import yaml
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from extproc import BUFFERED, POOLS, TOKEN, Gateway, open_stream
from proc import Proc, wait_for

from engine_advisor.service.epp import shared

SHA = "ab" * 32


def pools(generation=1, sha=SHA, names=("a", "b", "c")):
    ups = [SimpleNamespace(name=n, in_flight=0) for n in names]
    return SimpleNamespace(generation=generation, sha256=sha, upstreams=ups)


WORKER = textwrap.dedent("""
    import sys, time
    from types import SimpleNamespace
    from engine_advisor.service.epp import shared
    path, sha, picks = sys.argv[1], sys.argv[2], [int(x) for x in sys.argv[3].split(",")]
    ups = [SimpleNamespace(name=n, in_flight=0) for n in "abc"]
    pools = SimpleNamespace(generation=7, sha256=sha, upstreams=ups)
    counts = shared.Shared(path)
    for up, n in zip(ups, picks):
        for _ in range(n):
            counts.add(pools, up, 1)
    print("ready", flush=True)
    time.sleep(600)
""")


@pytest.fixture
def table(tmp_path):
    path = tmp_path / "in-flight"
    shared.create(path, 3)
    return path


def other_worker(table, picks: str, sha: str = SHA) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-c", WORKER, str(table), sha, picks],
                         stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "ready"
    return p


def end(p: subprocess.Popen) -> None:
    p.kill()
    p.wait()
    p.stdout.close()


def test_another_workers_picks_are_added_and_go_when_it_dies(table):
    mine = shared.Shared(table)
    p = pools()
    a, b, c = p.upstreams
    mine.add(p, a, 1)
    a.in_flight = 1 + 5                       # this worker's pick and 5 proxied requests
    other = other_worker(table, "2,0,3")
    try:
        mine.sync(p)
        assert [u.in_flight for u in p.upstreams] == [8, 0, 3]
        mine.sync(p)                          # again: nothing added twice
        assert [u.in_flight for u in p.upstreams] == [8, 0, 3]
    finally:
        end(other)
    mine.sync(p)
    assert [u.in_flight for u in p.upstreams] == [6, 0, 0]
    mine.close()


def test_a_worker_on_another_pools_file_is_not_added(table):
    mine = shared.Shared(table)
    p = pools()
    other = other_worker(table, "4,4,4", sha="cd" * 32)
    try:
        mine.sync(p)
        assert [u.in_flight for u in p.upstreams] == [0, 0, 0]
    finally:
        end(other)
    mine.close()


def test_own_picks_survive_a_reload_in_their_new_columns(table):
    """A reload that reorders the upstreams: this worker's slot is rewritten, so the other
    workers read each count under the right upstream."""
    mine = shared.Shared(table)
    old = pools(generation=1)
    a = old.upstreams[0]
    mine.add(old, a, 1)
    mine.add(old, a, 1)
    new = SimpleNamespace(generation=2, sha256="ef" * 32, upstreams=[old.upstreams[2], a])
    mine.sync(new)
    base = mine._base(mine.mine)
    assert mine.words[base + 1] == shared._tag(new)
    assert list(mine.words[base + shared.HEAD:base + shared.HEAD + 2]) == [0, 2]
    mine.close()


def test_open_counts_is_local_for_one_worker(monkeypatch, table):
    monkeypatch.setenv(shared.ENV, str(table))
    assert isinstance(shared.open_counts(1), shared.Local)
    counts = shared.open_counts(2)
    assert isinstance(counts, shared.Shared)
    counts.close()
    monkeypatch.setenv(shared.ENV, str(table.parent / "missing"))
    assert isinstance(shared.open_counts(2), shared.Local)


# ------------------------------------------------------------------- serve --workers 2
def total_in_flight(serve: Proc) -> float:
    with httpx.Client(timeout=10) as c:        # a new connection: any of the workers
        text = c.get(serve.url + "/metrics").text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("engine_advisor_proxy_upstream_in_flight{"))


def table_of(serve: Proc) -> str:
    """The in-flight table serve made for its workers (from a worker's environment)."""
    pid = serve.proc.pid
    for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
        for e in Path(f"/proc/{child}/environ").read_bytes().split(b"\0"):
            if e.startswith(shared.ENV.encode() + b"="):
                return e.split(b"=", 1)[1].decode()
    raise AssertionError(f"no worker of serve has {shared.ENV}")


def slots(path: str) -> list[tuple[int, int]]:
    """(pid, picks in flight) of each worker's slot."""
    words = memoryview(Path(path).read_bytes()).cast("q")
    per = shared.HEAD + shared.COLUMNS
    return [(words[2 + w * per], sum(words[2 + w * per + shared.HEAD:2 + (w + 1) * per]))
            for w in range(words[1])]


def picks_per_worker(path: str) -> list[int]:
    return [n for _, n in slots(path)]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_every_worker_counts_the_requests_of_all(tmp_path):
    path = tmp_path / "pools.yaml"
    path.write_text(yaml.safe_dump(POOLS))
    from engine_advisor.calibration.ports import free_port

    epp = free_port()
    serve = Proc("serve", "--workers", "2", "--upstreams", str(path), "--epp-port", str(epp),
                 "--log-level", "warning", env={"ENGINE_ADVISOR_EPP_TOKEN": TOKEN},
                 ready="/readyz")
    serve.start().wait_ready(120)
    table = table_of(serve)
    # both workers' pickers are up (each claimed its slot), so both take connections
    assert wait_for(lambda: all(pid for pid, _ in slots(table)), 60), slots(table)
    channels, held = [], []
    try:
        # each channel its own connection, which the kernel hands to either worker: open
        # them until both workers hold some of the requests
        while len(held) < 4 or min(picks_per_worker(table)) == 0:
            assert len(held) < 64, picks_per_worker(table)
            ch = grpc.insecure_channel(f"127.0.0.1:{epp}",
                                       options=[("grpc.use_local_subchannel_pool", 1)])
            channels.append(ch)
            sent, responses = open_stream(Gateway(pb_grpc.ExternalProcessorStub(ch)),
                                          mode=BUFFERED)
            next(responses), next(responses)               # decided: counted, held open
            held.append((sent, responses))
        n = len(held)
        assert sum(picks_per_worker(table)) == n
        # every worker (each scrape may reach either) says n, not its own share
        assert wait_for(lambda: all(total_in_flight(serve) == n for _ in range(20)), 30)
        for sent, _ in held:
            sent.put(None)                                 # the requests end
        assert wait_for(lambda: all(total_in_flight(serve) == 0 for _ in range(20)), 30)
        assert picks_per_worker(table) == [0, 0]
    finally:
        for _, responses in held:
            responses.cancel()
        for ch in channels:
            ch.close()
        serve.stop()
