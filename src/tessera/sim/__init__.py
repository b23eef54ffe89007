"""Discrete-event simulator: trace loaders, synthetic workloads, experiments, metrics and reports."""
