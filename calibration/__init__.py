"""Calibration: engine sweeps, fitting, GPU kernels, silicon tables (README.md)."""
