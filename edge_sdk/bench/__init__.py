"""Benchmarks of edge-sdk's kernels, as library functions returning rows of numbers (the CLI prints them)."""
