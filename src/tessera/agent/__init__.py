"""Node level: GPU discovery (NVML, or a declared simulated pool), the isolation settings a launched workload gets,
and GPU usage sampling for metrics."""
