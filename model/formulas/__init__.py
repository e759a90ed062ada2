"""The cost model's formulas, compiled by numba (``cache=True``).

The physics is written once, as scalar functions over one row, and compiled: a recommendation's
few rows and a training grid of 80,000 rows run the same code (microseconds for the first,
milliseconds for the second). The modules that own each quantity document it and pack its
constants into the arrays these functions read. Here, bottom to top:

- ``layout``: where each quantity sits in the arrays the formulas share (a row's fields, a
  model's constants, the terms' columns);
- ``hardware``: ``read_s``, one decode-attention call's seconds on a read curve
  (``engine_advisor.model.hardware.profiles``), and ``collective_s``, one collective
  (``engine_advisor.model.hardware.silicon.Collective``);
- ``memory``: ``pool_of`` and ``memory_fit``, KV capacity, state slots and the sequences that
  run at once, per engine (``engine_advisor.model.physics.memory``; each engine's layout
  ``engine_advisor.model.engines.base.StateLayout``);
- ``terms``: ``batch_terms``, ``decode_into``, ``prefill_into``, the terms
  (``engine_advisor.model.physics.terms``; ``K`` packed by
  ``engine_advisor.model.physics.terms.Physics``, positions in ``layout``);
- ``rows``: ``rows_into``, a case's rows, waves included
  (``engine_advisor.model.physics.features.case_features``);
- ``predict``: ``predict_into``, coefficients x features, intervals; ``predict_rows`` both
  passes in one call (``engine_advisor.model.predict.predictor``);
- ``evaluate``: ``evaluate_rows``, one query's configurations at its sizes
  (``engine_advisor.model.predict.query.Query.evaluate``).

A formula compiled with another module's formula inlined or linked is cached with the source
of the whole package, not only its own file (``cache``: numba's own stamp is the function's
file): the locator is registered here, before any of the modules compiles.
``NUMBA_DISABLE_JIT=1`` runs them as plain Python (a test compares both).
"""

from engine_advisor.model.formulas.cache import register

register()
