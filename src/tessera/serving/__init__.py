"""LLM serving on shared GPUs.

- ``models``: the model catalog (shapes, weight and KV-cache bytes, default tensor parallelism).
- ``perf_model``: engine timing (prefill, decode) calibrated on measured latencies, and user CSV profiles.
- ``policies``: the pure serving policies (engine model, routers, model cache, autoscaler, admission, dynamic
  batching): no I/O and no clock; ``now`` is an argument and decisions are returned as data.

The serving twin (``tessera.sim.serving``) replays these very objects in virtual time; the live gateway uses them
in real time. See docs/serving.md.
"""
