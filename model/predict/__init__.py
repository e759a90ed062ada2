"""Stage 4, predictions: a workload's query as a case (``query``), the fitted model's caches
and compiled prediction tables (``predictor``), and many workloads at once (``batch``)."""
