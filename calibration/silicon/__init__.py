"""GPU profiles from aiconfigurator-core's measured per-operation tables (README.md)."""
