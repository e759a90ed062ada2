"""Fit the cost model from dataset rows, and its report (README.md)."""
