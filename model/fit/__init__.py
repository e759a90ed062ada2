"""Stage 3, fitted efficiencies: the calibration dataset (``dataset``, ``rows``), one engine's
estimator (``estimator``), the pooled and held-out fit (``fitting``), the fitted ``CostModel``
(``costmodel``), its files (``codec``, ``artifact``, ``legacy``), the embedded default model
(``default``) and the seed's assumptions (``seedcheck``)."""
