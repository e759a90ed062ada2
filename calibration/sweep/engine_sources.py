"""Every source of an engine's facts at hand, merged into one ``EngineFacts`` (``gather``: the
live endpoints first, then the launch command, then the start-up log); what the command of an
engine the sweep launched (``--launch``) sets (``command_facts``: ``--load-format`` and the
engine's running-request flag, vLLM ``--max-num-seqs``, SGLang ``--max-running-requests``,
TensorRT-LLM ``--max_batch_size``); and a
dataset row's ``weights`` from them (``weights_of``).
"""

from __future__ import annotations

from typing import Any

from engine_advisor.calibration.errors import CalibrationError
from engine_advisor.calibration.sweep.engine_endpoints import SERVER_INFO_PARSERS, parse_metrics
from engine_advisor.calibration.sweep.engine_facts import EngineFacts
from engine_advisor.calibration.sweep.engine_logs import parse_log
from engine_advisor.model import engines

# Engines that run with the running-request limit they were launched with (SGLang may lower
# it to what its KV and state pools hold, and says so; TensorRT-LLM's --max_batch_size is its
# scheduler's limit as given)
RUNS_AS_LAUNCHED = {"vllm", "trtllm"}


class FactsError(CalibrationError, ValueError):
    """Engine facts that contradict a flag; the message names the flag and both values."""


def _flag_value(command: list[str], flag: str) -> str | None:
    """The last value of ``flag`` (``--flag V`` or ``--flag=V``; ``_`` for ``-`` too)."""
    value = None
    for i, part in enumerate(command):
        name, eq, rest = part.partition("=")
        if not name.startswith("--") or name.replace("_", "-") != flag.replace("_", "-"):
            continue
        if eq:
            value = rest
        elif i + 1 < len(command):
            value = command[i + 1]
    return value


def command_facts(engine: str, command: list[str]) -> EngineFacts:
    """What a launched engine's argv sets: ``--load-format`` and the running-request limit
    (the engine's ``max_running_flag``: vLLM ``--max-num-seqs``, SGLang
    ``--max-running-requests``), which vLLM runs with as given."""
    f = EngineFacts()
    f._set("load_format", _flag_value(command, "--load-format"), "command")
    flag = engines.REGISTRY[engine].max_running_flag if engine in engines.REGISTRY else None
    value = _flag_value(command, flag) if flag else None
    if value is not None and value.isdigit() and int(value) > 0:
        f._set("max_running_requested", int(value), "command")
        if engine in RUNS_AS_LAUNCHED:
            f._set("max_running", int(value), "command")
    return f


def gather(engine: str, *, metrics: str | None = None, server_info: Any = None,
           log: str | None = None, command: list[str] | None = None) -> EngineFacts:
    """Every source at hand, the live ones first (``/metrics``, server info) and the start-up
    log after them; ``command``: a launched engine's argv (``command_facts``)."""
    facts = EngineFacts()
    if metrics:
        facts = facts.merged(parse_metrics(metrics))
    if server_info is not None and engine in SERVER_INFO_PARSERS:
        facts = facts.merged(SERVER_INFO_PARSERS[engine](server_info))
    if command:
        facts = facts.merged(command_facts(engine, command))
    if log:
        facts = facts.merged(parse_log(engine, log))
    return facts


def weights_of(facts: EngineFacts, load_format: str | None) -> str:
    """A row's ``weights``: ``--load-format`` when given (an engine that says otherwise is an
    error), else what the engine states, else ``real``."""
    stated = facts.dummy_weights
    if load_format is not None:
        if load_format not in ("dummy", "real"):
            raise FactsError(f"--load-format: expected dummy or real, got {load_format!r}")
        if stated is not None and stated != (load_format == "dummy"):
            raise FactsError(f"--load-format {load_format} contradicts the engine, which "
                             f"reports load_format {facts.load_format!r} (from "
                             f"{facts.sources.get('load_format', '?')})")
        return load_format
    return "dummy" if stated else "real"
