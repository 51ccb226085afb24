"""Trace-driven simulator: drives the real core on recorded or synthetic workloads under a virtual clock."""
