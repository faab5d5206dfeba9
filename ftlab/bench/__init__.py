"""Benchmarks: ``ftlab bench <op>`` on a GPU (see :mod:`ftlab.bench.harness`)."""
