"""Run ``engine-advisor sim`` as a real process on a free loopback port (test helper)."""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from proc import free_port, owns_port, terminate

EXE = str(Path(sys.executable).with_name("engine-advisor"))



class SimProcess:
    """``with SimProcess("--engine", "vllm", ...) as sim:`` starts it and waits for /health."""

    def __init__(self, *args: str, wait: bool = True, timeout: float = 60.0):
        self.port = free_port()
        self.args = [EXE, "sim", "--port", str(self.port), *args]
        self.wait = wait
        self.timeout = timeout
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None
        self._clients: list = []
        self._log = tempfile.NamedTemporaryFile(prefix="sim-", suffix=".log", delete=False)

    @property
    def log(self) -> str:
        return Path(self._log.name).read_text(errors="replace")

    def start(self) -> SimProcess:
        self.proc = subprocess.Popen(self.args, stdout=self._log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL)
        if self.wait:
            self.wait_ready()
        return self

    def listening(self) -> bool:
        try:
            httpx.get(self.url + "/health", timeout=1.0)
            return True
        except httpx.TransportError:
            return False

    def wait_ready(self) -> None:
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"sim exited with {self.proc.returncode}:\n{self.log}")
            try:
                if (httpx.get(self.url + "/health", timeout=1.0).status_code == 200
                        and owns_port(self.proc.pid, self.port) is not False):
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        log = self.log
        self.stop()
        raise RuntimeError(f"sim not healthy after {self.timeout} s:\n{log}")

    def stop(self) -> None:
        for c in self._clients:
            c.close()
        self._clients.clear()
        terminate(self.proc)
        self._log.close()
        Path(self._log.name).unlink(missing_ok=True)

    def __enter__(self) -> SimProcess:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc) -> None:
        self.stop()

    def openai(self, **kw):
        import openai
        kw.setdefault("max_retries", 0)
        kw.setdefault("timeout", 30.0)
        client = openai.OpenAI(base_url=self.url + "/v1", api_key="sim", **kw)
        self._clients.append(client)
        return client

    def metric(self, name: str) -> float:
        """The value of one unlabelled-by-extra-labels sample of the /metrics page."""
        text = httpx.get(self.url + "/metrics", timeout=5.0).text
        for line in text.splitlines():
            if line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
        raise KeyError(name)


def make_artifact(path: Path, *, ttft_s: float, tpot_s: float, engines=("vllm", "sglang")) -> Path:
    """A fitted cost-model artifact from synthetic dataset rows with the given TTFT and TPOT
    (constant over a small grid of contexts and batches), for a simulator with other timing."""
    from engine_advisor.model.fit.artifact import save
    from engine_advisor.model.fit.costmodel import CostModel
    from engine_advisor.model.fit.dataset import Measurement

    rows = []
    for engine in engines:
        for ctx in (1024, 8192, 32768):
            for batch in (1, 8):
                rows.append(Measurement(engine=engine, gpu="B300", num_gpus=8, dcp_size=1,
                                        mem_fraction=0.9, context_tokens=ctx, output_tokens=128,
                                        batch_size=batch, kv_bytes_per_token=70272,
                                        ttft_s=ttft_s, tpot_s=tpot_s, source="synthetic"))
    model = CostModel.fit(rows, sources=["synthetic"])
    save(model, path)
    return path
