"""What the simulator runs: the timeline job model (``jobs``), the ``openb``, ``training`` and ``tenants`` generators,
jobs and queues from JSON ``files``, the workload chosen by the command line's options (``inputs``), cluster shapes
(``clusters``), the synthetic openb-shaped default (``synthetic``) and the measured models they draw on (``gavel``
throughputs, ``philly`` runtimes).
"""
