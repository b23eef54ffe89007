"""The serving twin: replays an LLM request trace onto a simulated GPU cluster through the pure serving policies
(``tessera.serving.policies``) and the calibrated engine timing (``tessera.serving.perf_model``). See
docs/serving.md."""
