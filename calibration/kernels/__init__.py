"""Triton kernels used by the GPU calibration (imported only where Triton is installed)."""
