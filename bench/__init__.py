"""Benchmarks run by `make bench`: each prints a table and adds its figures to bench/results.json."""
