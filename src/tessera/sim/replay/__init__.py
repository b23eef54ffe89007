"""The timeline replay, the digital twin: workloads arrive, wait, run and leave on the core scheduler.

The entry point is ``tessera.sim.replay.timeline.run_timeline``; the other modules are its physics (``runs``,
``progress``, ``colocation``), its measures (``accounts``, ``reclaim``) and its result types (``result``).
"""
