"""Relaying one proxied request: attempts over upstreams, the whole answer or the stream.

- ``attempts``: ``Relay``, one request's attempts: the first upstream the decision picked,
  retries on others, timeouts, the mapping of every failure to the client's answer, and the
  client's disconnect (it cancels the attempts, which closes the upstream connection, so the
  engine aborts the request; counted as 499).
- ``reply``: ``Reply``, the answer to the client as it goes (what was sent, from which upstream,
  the deadline's phase) and the error event that ends a cut stream. A ``Relay`` is one; ``whole``,
  ``stream`` and ``observe`` work on a ``Reply`` and import nothing of the attempts.
- ``whole``: a non-streaming answer (or an error answer) passed on whole.
- ``stream``: a streamed answer passed on event by event.
- ``writer``: how a relay writes to its client: the direct lane's cycle (whole responses as
  bytes) or ASGI ``send``; and how it hears the client go away.
- ``failure``, ``passed``, ``observe``: what a failed attempt is, which headers cross the
  proxy, what a finished request teaches (engine_advisor.service.proxy.observations).
- ``valid``: what is checked before it is passed on: a whole answer is JSON, every SSE
  ``data:`` line is JSON or ``[DONE]``.

The request body goes upstream byte for byte; so does the answer. A streamed answer is forwarded
event by event (whole ``data: ...\\n\\n`` events, as they arrive, never re-split or re-encoded), so
a failure can never leave half an event at the client. Nothing reaches the client before the
upstream's first complete event (streaming) or whole body (non-streaming). Until then a connect
error, a 429 or 5xx, a connection cut, or a response the client refuses
(engine_advisor.service.transport.client: malformed, ambiguous or over ``limits``; logged) is
retried on another upstream (the chosen engine's first, then, with ``retries.other_engine``, the
other engine's) after a jittered backoff that honours ``Retry-After``. After that, a failure ends
the stream with an error event ``data: {"error": {...}}``. A single event longer than
``limits.event_bytes`` is refused like a malformed response. A 2xx body or a data line that is not
JSON takes the same ways (502 before the first event, an error event after it), and counts against
the upstream's breaker at once (``engine_advisor_proxy_upstream_faults_total``, reason ``invalid``).

Breakers no client can trip for everyone: a 5xx, a cut or a response over the limits
(``failure.DEFERRED``) counts against the upstream's breaker only once another upstream has
done better (or none could be tried); when a second upstream fails the same request the same
way, it is the request's failure: answered as it is, retried no further, counted against no
breaker (``engine_advisor_proxy_request_failures_total``). Connect errors and timeouts count at
once.

Timeouts: ``connect_s`` (TCP connect), ``first_byte_s`` (streaming: until the first event),
``answer_s`` (non-streaming: the whole answer, which an engine sends once it has generated it),
``idle_s`` (streaming: between events; and no byte for that long in an answer under way, whole or
streamed: the pool's reaper, engine_advisor.service.transport.reaper), ``total_s`` (the whole
request). A timeout answers 504 (or an error event mid-stream) and is not retried. They are checked
on one shared clock (engine_advisor.service.proxy.deadlines): never early, up to 50 ms late (the
reaper's: up to a quarter of ``idle_s``, at most 1 s). A stream is over at ``[DONE]``: counted and
observed then; the upstream has ``end_grace_s`` to end its response before its connection is closed
(engine_advisor.service.proxy.relay.stream).
"""
