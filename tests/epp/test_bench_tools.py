"""The picker's benchmark tools still run against the picker as it is: bench/epp_cold.py
(the picker's Exchange fed Envoy-shaped bytes) and bench/epp_floor_serve.py (serve with the
floor's handler), each as a real process."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import grpc
import yaml
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from extproc import AUTH, BUFFERED, POOLS, SHORT, TOKEN, buffered, headers, raw_of
from proc import free_port

ROOT = Path(__file__).resolve().parents[2]


def test_epp_cold_prints_its_table():
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "epp_cold.py"), "--requests",
                          "100", "--reps", "1", "--pollute-mb", "1"], capture_output=True,
                         text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = {line.split("|")[1].strip(): line for line in out.stdout.splitlines()
            if line.startswith("| picker") or line.startswith("| floor")}
    assert set(rows) == {"picker, warm", "floor, warm", "picker, cold", "floor, cold"}
    total = float(rows["picker, cold"].split("|")[5])
    assert total > 0


def test_the_floor_in_serve_answers_every_message_continue(tmp_path):
    pools = tmp_path / "pools.yaml"
    pools.write_text(yaml.safe_dump(POOLS))
    port, epp = free_port(), free_port()
    with (tmp_path / "serve.log").open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, str(ROOT / "bench" / "epp_floor_serve.py"), "serve", "--port",
             str(port), "--epp-port", str(epp), "--upstreams", str(pools), "--log-level",
             "warning"], stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
            env={**os.environ, "ENGINE_ADVISOR_EPP_TOKEN": TOKEN})
    try:
        channel = grpc.insecure_channel(f"127.0.0.1:{epp}")
        call = channel.stream_stream("/envoy.service.ext_proc.v3.ExternalProcessor/Process",
                                     request_serializer=pb.ProcessingRequest.SerializeToString,
                                     response_deserializer=pb.ProcessingResponse.FromString)
        deadline = time.monotonic() + 120
        while True:
            try:
                got = list(call(iter([headers(mode=BUFFERED), buffered(raw_of(SHORT))]), timeout=10,
                                metadata=AUTH))
                break
            except grpc.RpcError as exc:
                if exc.code() != grpc.StatusCode.UNAVAILABLE:     # not merely starting
                    raise
                assert proc.poll() is None, (tmp_path / "serve.log").read_text()[-2000:]
                assert time.monotonic() < deadline, "the floor in serve never answered"
                time.sleep(0.5)
        assert [r.WhichOneof("response") for r in got] == ["request_headers", "request_body"]
        assert not got[1].request_body.HasField("response")      # CONTINUE: nothing changed
        channel.close()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
