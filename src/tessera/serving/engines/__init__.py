"""Inference engines behind one seam (``base.EngineAdapter``): the simulated engine first (``sim``, a real
OpenAI-compatible HTTP process paced by the part-1 engine model), real engines (vLLM, SGLang, ``transformers serve``)
as adapters of the same shape. The gateway scrapes their ``/metrics``; the serving controller starts and stops them.
"""
