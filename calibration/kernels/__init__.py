"""GPU kernel calibration: the benchmarks of ``calibrate gpu`` and ``calibrate dcp``, their
profiles, and the Triton kernels they time (README.md)."""
