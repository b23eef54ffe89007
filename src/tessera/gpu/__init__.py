"""GPUs of a node: discovery (NVML, or a declared simulated pool), the isolation settings a launched workload gets,
and GPU usage sampling for metrics.

Modules: ``gpus`` (seam types, pool specs, ``SimulatedProbe``), ``nvml`` (``NvmlProbe``), ``discovery``
(``detect_gpus``), ``isolation`` (environment and enforcement report), ``watchdog`` (memory watchdog), ``dcgm``
(Prometheus collector with dcgm-exporter names) and ``fakes`` (a fake NVML for tests and GPU-less demos).

The only package that talks to NVML (``pynvml``); the server, and later a node-agent daemon, use it.
"""
