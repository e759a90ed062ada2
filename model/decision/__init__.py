"""Stage 5, decision: which configurations may serve a workload (``candidates``,
``capabilities``), which is chosen and how sure it is (``choose``), where the best engine
changes (``crossover``), and why nothing fits (``nofit``)."""
