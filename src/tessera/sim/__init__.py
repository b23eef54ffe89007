"""The simulator, grouped by purpose: the event ``kernel``; the timeline ``replay`` (the digital twin: physics and
measures around the core scheduler); the FGD ``placement_study`` (arrival inflation, sweeps, placement speed); the
``workloads`` they run (generators, job models, measured tables); the ``traces`` file formats; and the ``reports``
written from their results. ``tessera simulate`` and ``bench/`` call them.
"""
