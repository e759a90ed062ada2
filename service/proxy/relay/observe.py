"""What a finished request teaches: its usage counts, timings and a row of observations."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from engine_advisor.service.proxy.observations import Observation
from engine_advisor.service.proxy.upstreams import Upstream

if TYPE_CHECKING:
    from engine_advisor.service.proxy.relay.reply import Reply

_row = tuple.__new__            # Observation._make without its length check (fields are fixed)


class UsageField:
    """A usage count in a response body: the number of its last ``"name": N``.

    ``findall(data)[-1]`` of the pattern, found by ``rfind`` of the quoted name rather than
    the regex engine's scan of every position. Matches cannot overlap (after the opening
    quote only spaces, a colon and digits), so the last one starts at the last occurrence of
    the name that the pattern matches at."""

    __slots__ = ("key", "pattern")

    def __init__(self, name: bytes):
        self.key = b'"%b"' % name
        self.pattern = re.compile(re.escape(self.key) + rb"\s*:\s*(\d+)")

    def last(self, data: bytes) -> int | None:
        key, match = self.key, self.pattern.match
        i = data.rfind(key)
        while i >= 0:
            m = match(data, i)
            if m is not None:
                return int(m.group(1))
            i = data.rfind(key, 0, i)
        return None


COMPLETION = UsageField(b"completion_tokens")
PROMPT = UsageField(b"prompt_tokens")


COMPLETION = UsageField(b"completion_tokens")
PROMPT = UsageField(b"prompt_tokens")


def observe(relay: Reply, up: Upstream, tail: bytes, n: int, ttft: float | None, total: float,
            batch: int) -> None:
    """One finished request's timings: the metrics, and a row of
    engine_advisor.service.proxy.observations (``n`` output tokens; ``tail``: where the usage counts
    are, if anywhere)."""
    st, pools = relay.state, relay.pools
    prompt = PROMPT.last(tail)
    if prompt is None:
        prompt = relay.prompt_tokens
    tpot = (total - ttft) / (n - 1) if ttft is not None and n > 1 else None
    if ttft is not None:
        st.metrics.child(st.metrics.ttft, up.engine).observe(ttft)
    if tpot is not None:
        st.metrics.child(st.metrics.tpot, up.engine).observe(tpot)
        pred = relay.decision.predictions.get(up.group)
        if pred is not None and pred.tpot_s > 0:
            st.metrics.child(st.metrics.tpot_ratio, up.engine).observe(tpot / pred.tpot_s)
    head, tail_ = up.observed
    if head is None or up.observed_of != pools.generation:   # per upstream and pools file
        w = pools.config.workload
        head = (up.engine, up.name, pools.gpu_name, w.num_gpus, up.spec.dcp_size,
                up.spec.mem_fraction, pools.kv_bytes_per_token, pools.kv_shards)
        tail_ = (w.preset or "", w.kv_cache_dtype)
        up.observed, up.observed_of = (head, tail_), pools.generation
    st.observations.add(_row(Observation, (*head, prompt if prompt > 1 else 1, n, batch,
                                           ttft, tpot, total, *tail_)))
